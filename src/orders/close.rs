//! The `order-close` built-in handler: closes an expired, unpaid order in the database.
//!
//! For each delivery it runs [`Orders::close`] (one conditional `UPDATE`) with "now" from
//! the client's clock (the Redis server's), and acknowledges whatever the database says:
//!
//! | outcome           | what happens                                                |
//! |-------------------|-------------------------------------------------------------|
//! | `closed`          | this delivery closed it                                     |
//! | `already_paid`    | nothing (a paid order is never closed)                      |
//! | `already_closed`  | nothing (a redelivery, a duplicate, or reconciliation won)  |
//! | `not_yet_expired` | the expiry was extended: the order is rescheduled for it    |
//! | `unknown_order`   | nothing; logged (an event without a row)                    |
//!
//! A database error is a retryable failure (the worker's backoff applies), never an ack.
//! The statement runs inside the delivery's `process` span, in a CLIENT span of its own
//! (`UPDATE orders`, see [`crate::engine::trace`]).
//! Each outcome is counted in `delayq_order_close_total{queue,group,outcome}`.

use crate::engine::client::Client;
use crate::engine::message::{Mode, NewOrder, Payload, When};
use crate::engine::worker::{Delivery, Handler, HandlerError, HandlerResult};
use crate::orders::repo::{CloseOutcome, Orders};
use tracing::Instrument;

/// The `close_reason` written for a scheduled close event.
pub const REASON_EXPIRED: &str = "expired";
/// The `close_reason` written for a close event that reconciliation scheduled (its original
/// event was lost or never sent).
pub const REASON_RECONCILED: &str = "reconciled";

/// Closes expired orders; see the module documentation.
#[derive(Debug, Clone)]
pub struct OrderClose {
    orders: Orders,
    client: Client,
}

impl OrderClose {
    /// A handler closing orders in `orders`, reading "now" from and rescheduling through
    /// `client`.
    pub fn new(orders: Orders, client: &Client) -> OrderClose {
        OrderClose {
            orders,
            client: client.clone(),
        }
    }

    /// Handles the close event of order `id` on `queue` (what [`Handler::handle`] does, for
    /// callers without a [`Delivery`]). A database or Redis failure is an error to retry.
    pub async fn close_order(
        &self,
        queue: &str,
        id: &str,
        payload: &serde_json::Value,
    ) -> crate::orders::error::Result<CloseOutcome> {
        self.close_with_text(queue, id, &payload.to_string()).await
    }

    /// [`close_order`](Self::close_order) with the payload as its JSON text: a rescheduled
    /// event keeps it byte for byte.
    pub async fn close_with_text(
        &self,
        queue: &str,
        id: &str,
        payload_text: &str,
    ) -> crate::orders::error::Result<CloseOutcome> {
        let now = self.client.now_ms();
        let parsed: serde_json::Value =
            serde_json::from_str(payload_text).unwrap_or(serde_json::Value::Null);
        let reconciled = parsed.get("reconciled") == Some(&serde_json::Value::Bool(true));
        let reason = if reconciled {
            REASON_RECONCILED
        } else {
            REASON_EXPIRED
        };
        // A CLIENT span for the statement, inside the delivery's `process` span (free when
        // nothing records `delayq::otel` spans).
        let sql = tracing::info_span!(
            target: crate::engine::trace::SPAN_TARGET,
            "UPDATE orders",
            otel.kind = "client",
            db.system.name = match self.orders.db().backend() {
                "postgres" => "postgresql",
                other => other,
            },
            db.operation.name = "UPDATE",
            db.collection.name = "orders",
            messaging.message.id = id,
        );
        let outcome = self.orders.close(id, now, reason).instrument(sql).await?;
        match outcome {
            CloseOutcome::NotYetExpired { expires_at } => {
                // The database is the system of record: follow its expiry. The event keeps
                // its payload byte for byte; a reconciliation's event becomes an ordinary
                // expiry (it is one now: the order is known to Redis again).
                let payload = if reconciled {
                    Payload::from_value(&serde_json::json!({ "expires_at": expires_at }))
                } else {
                    Payload::from_json(payload_text)
                        .unwrap_or_else(|_| Payload::from_value(&parsed))
                };
                self.client
                    .schedule_with(
                        queue,
                        NewOrder::new(id, When::AtMs(expires_at), payload),
                        Mode::Upsert,
                    )
                    .await?;
                tracing::info!(
                    queue,
                    id = ?id,
                    expires_at,
                    "order expiry was extended; rescheduled"
                );
            }
            CloseOutcome::UnknownOrder => {
                tracing::warn!(
                    queue,
                    id = ?id,
                    "close event for an order the database does not have"
                );
            }
            _ => {}
        }
        Ok(outcome)
    }
}

impl Handler for OrderClose {
    async fn handle(&self, d: Delivery) -> HandlerResult {
        match self.close_with_text(&d.queue, &d.id, &d.payload_text).await {
            Ok(outcome) => {
                crate::engine::telemetry::order_close(&d.queue, &d.group, outcome.label());
                Ok(())
            }
            Err(e) => Err(HandlerError::retry(e)),
        }
    }
}
