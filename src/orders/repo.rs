//! The `orders` table (see `migrations/`): what the checkout service writes (create, pay,
//! extend) and what the `order-close` handler and the reconciliation job read and close.
//!
//! Every state change is one conditional statement, so concurrent or repeated calls (a
//! redelivered close event, a payment racing the close) can never move an order out of a
//! final state: `pending → paid` only before `expires_at`, `pending → closed` only at or after
//! it, and nothing leaves `paid` or `closed`.

use crate::engine::error::InvalidInput;
use crate::engine::keys::validate_id;
use crate::orders::db::{Db, db_err, with_pool};
use crate::orders::error::Result;
use serde::Serialize;

/// An order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Created, neither paid nor closed.
    Pending,
    /// Paid before it expired.
    Paid,
    /// Closed unpaid after it expired.
    Closed,
}

impl OrderStatus {
    fn parse(s: &str) -> Result<OrderStatus> {
        match s {
            "pending" => Ok(OrderStatus::Pending),
            "paid" => Ok(OrderStatus::Paid),
            "closed" => Ok(OrderStatus::Closed),
            other => Err(crate::orders::error::Error::Data {
                context: "reading an order",
                detail: format!("unknown status {other:?}"),
            }),
        }
    }
}

/// One row of `orders`. Timestamps are unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRow {
    /// The order id (also its delayq id).
    pub id: String,
    /// Its status.
    pub status: OrderStatus,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// When it was created.
    pub created_at: i64,
    /// When it expires unless paid.
    pub expires_at: i64,
    /// When it was paid.
    pub paid_at: Option<i64>,
    /// When it was closed.
    pub closed_at: Option<i64>,
    /// Why it was closed (`expired`, `reconciled`).
    pub close_reason: Option<String>,
}

/// What a close attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseOutcome {
    /// This call closed it.
    Closed,
    /// It was paid: left as it is.
    AlreadyPaid,
    /// It was closed before (a redelivery or a duplicate): left as it is.
    AlreadyClosed,
    /// It is pending but expires later (its expiry was extended): left as it is.
    NotYetExpired {
        /// The expiry in the database.
        expires_at: i64,
    },
    /// No such order.
    UnknownOrder,
}

impl CloseOutcome {
    /// The metrics label: `closed`, `already_paid`, `already_closed`, `not_yet_expired`,
    /// `unknown_order`.
    pub fn label(&self) -> &'static str {
        match self {
            CloseOutcome::Closed => "closed",
            CloseOutcome::AlreadyPaid => "already_paid",
            CloseOutcome::AlreadyClosed => "already_closed",
            CloseOutcome::NotYetExpired { .. } => "not_yet_expired",
            CloseOutcome::UnknownOrder => "unknown_order",
        }
    }
}

/// What a payment attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PayOutcome {
    /// This call marked it paid.
    Paid,
    /// It was paid before.
    AlreadyPaid,
    /// It expired (closed, or due to be closed): not paid.
    Expired,
    /// No such order.
    UnknownOrder,
}

/// Orders by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatusCounts {
    /// Pending orders.
    pub pending: u64,
    /// Paid orders.
    pub paid: u64,
    /// Closed orders.
    pub closed: u64,
}

const INSERT: &str = "INSERT INTO orders (id, status, amount_cents, created_at, expires_at) \
     VALUES ($1, 'pending', $2, $3, $4) ON CONFLICT (id) DO NOTHING";
const PAY: &str = "UPDATE orders SET status = 'paid', paid_at = $2 \
     WHERE id = $1 AND status = 'pending' AND expires_at > $2";
const EXTEND: &str = "UPDATE orders SET expires_at = $2 WHERE id = $1 AND status = 'pending'";
const CLOSE: &str = "UPDATE orders SET status = 'closed', closed_at = $2, close_reason = $3 \
     WHERE id = $1 AND status = 'pending' AND expires_at <= $2";
const SELECT: &str = "SELECT id, status, amount_cents, created_at, expires_at, paid_at, \
     closed_at, close_reason FROM orders WHERE id = $1";
const OVERDUE: &str = "SELECT id, expires_at FROM orders \
     WHERE status = 'pending' AND expires_at <= $1 \
     AND (expires_at > $2 OR (expires_at = $2 AND id > $3)) \
     ORDER BY expires_at, id LIMIT $4";
const COUNTS: &str = "SELECT status, COUNT(*) FROM orders GROUP BY status";

type Row = (
    String,
    String,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// The `orders` table on one database.
#[derive(Debug, Clone)]
pub struct Orders {
    db: Db,
}

impl Orders {
    /// The table on `db` (migrated with [`Db::migrate`]).
    pub fn new(db: Db) -> Orders {
        Orders { db }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates a pending order; `false` when the id exists (the row is left as it is, so a
    /// retried checkout is harmless).
    pub async fn create(
        &self,
        id: &str,
        amount_cents: i64,
        created_at: i64,
        expires_at: i64,
    ) -> Result<bool> {
        validate_id(id)?;
        if amount_cents < 0 {
            return Err(InvalidInput::Option {
                name: "amount_cents",
                reason: format!("must not be negative, got {amount_cents}"),
            }
            .into());
        }
        let n = with_pool!(&self.db, p => sqlx::query(INSERT)
            .bind(id).bind(amount_cents).bind(created_at).bind(expires_at)
            .execute(p).await.map(|r| r.rows_affected()))
        .map_err(db_err("creating an order"))?;
        Ok(n == 1)
    }

    /// Marks a pending order paid, if it has not expired at `now`.
    pub async fn pay(&self, id: &str, now: i64) -> Result<PayOutcome> {
        let n = with_pool!(&self.db, p => sqlx::query(PAY)
            .bind(id).bind(now).execute(p).await.map(|r| r.rows_affected()))
        .map_err(db_err("paying an order"))?;
        if n == 1 {
            return Ok(PayOutcome::Paid);
        }
        Ok(match self.get(id).await? {
            None => PayOutcome::UnknownOrder,
            Some(o) if o.status == OrderStatus::Paid => PayOutcome::AlreadyPaid,
            Some(_) => PayOutcome::Expired,
        })
    }

    /// Moves a pending order's expiry to `expires_at`; `false` when it is not pending.
    pub async fn extend(&self, id: &str, expires_at: i64) -> Result<bool> {
        let n = with_pool!(&self.db, p => sqlx::query(EXTEND)
            .bind(id).bind(expires_at).execute(p).await.map(|r| r.rows_affected()))
        .map_err(db_err("extending an order"))?;
        Ok(n == 1)
    }

    /// Closes the order if it is pending and expired at `now`, in one conditional statement;
    /// otherwise says why not.
    pub async fn close(&self, id: &str, now: i64, reason: &str) -> Result<CloseOutcome> {
        // The statement decides; the read after a refusal only explains it. If the row
        // changed in between (so that it now looks closable), decide again.
        for _ in 0..3 {
            let n = with_pool!(&self.db, p => sqlx::query(CLOSE)
                .bind(id).bind(now).bind(reason).execute(p).await.map(|r| r.rows_affected()))
            .map_err(db_err("closing an order"))?;
            if n == 1 {
                return Ok(CloseOutcome::Closed);
            }
            match self.get(id).await? {
                None => return Ok(CloseOutcome::UnknownOrder),
                Some(o) => match o.status {
                    OrderStatus::Paid => return Ok(CloseOutcome::AlreadyPaid),
                    OrderStatus::Closed => return Ok(CloseOutcome::AlreadyClosed),
                    OrderStatus::Pending if o.expires_at > now => {
                        return Ok(CloseOutcome::NotYetExpired {
                            expires_at: o.expires_at,
                        });
                    }
                    OrderStatus::Pending => continue,
                },
            }
        }
        Err(crate::orders::error::Error::Contention {
            context: "closing an order",
            id: id.to_owned(),
        })
    }

    /// One order.
    pub async fn get(&self, id: &str) -> Result<Option<OrderRow>> {
        let row: Option<Row> = with_pool!(&self.db, p => sqlx::query_as(SELECT)
            .bind(id).fetch_optional(p).await)
        .map_err(db_err("reading an order"))?;
        row.map(
            |(
                id,
                status,
                amount_cents,
                created_at,
                expires_at,
                paid_at,
                closed_at,
                close_reason,
            )| {
                Ok(OrderRow {
                    id,
                    status: OrderStatus::parse(&status)?,
                    amount_cents,
                    created_at,
                    expires_at,
                    paid_at,
                    closed_at,
                    close_reason,
                })
            },
        )
        .transpose()
    }

    /// Up to `limit` pending orders that expired at or before `cutoff`, as (id, expires_at),
    /// ordered by (expires_at, id) and strictly after `after` (keyset paging: pass the last
    /// row of the previous page).
    pub async fn overdue(
        &self,
        cutoff: i64,
        after: Option<&(String, i64)>,
        limit: usize,
    ) -> Result<Vec<(String, i64)>> {
        let (after_id, after_exp) = match after {
            Some((id, exp)) => (id.as_str(), *exp),
            None => ("", i64::MIN),
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(String, i64)> = with_pool!(&self.db, p => sqlx::query_as(OVERDUE)
            .bind(cutoff).bind(after_exp).bind(after_id).bind(limit)
            .fetch_all(p).await)
        .map_err(db_err("listing overdue orders"))?;
        Ok(rows)
    }

    /// Orders by status.
    pub async fn counts(&self) -> Result<StatusCounts> {
        let rows: Vec<(String, i64)> =
            with_pool!(&self.db, p => sqlx::query_as(COUNTS).fetch_all(p).await)
                .map_err(db_err("counting orders"))?;
        let mut c = StatusCounts::default();
        for (status, n) in rows {
            let n = u64::try_from(n).unwrap_or(0);
            match OrderStatus::parse(&status)? {
                OrderStatus::Pending => c.pending = n,
                OrderStatus::Paid => c.paid = n,
                OrderStatus::Closed => c.closed = n,
            }
        }
        Ok(c)
    }
}
