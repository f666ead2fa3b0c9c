-- The orders table: written by the checkout service (create, pay, extend), closed by
-- delayq's `order-close` handler and its reconciliation job.
--
-- One schema for PostgreSQL and SQLite: timestamps are unix milliseconds (BIGINT) on both,
-- status is a TEXT with a CHECK, so one set of queries serves both backends.
CREATE TABLE IF NOT EXISTS orders (
    id           TEXT   PRIMARY KEY,
    status       TEXT   NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'paid', 'closed')),
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    paid_at      BIGINT,
    closed_at    BIGINT,
    close_reason TEXT,
    CHECK (status <> 'paid' OR paid_at IS NOT NULL),
    CHECK (status <> 'closed' OR closed_at IS NOT NULL)
);

-- Reconciliation: pending orders by expiry (keyset-paged on (expires_at, id)).
CREATE INDEX IF NOT EXISTS orders_pending_by_expiry
    ON orders (expires_at, id)
    WHERE status = 'pending';
