//! The orders domain (feature `orders`): the `orders` table and what keeps it in step with
//! the queue.
//!
//! - [`db`]: the database pool (PostgreSQL or SQLite) and the embedded migrations.
//! - [`repo`]: the `orders` table: create, pay, extend, conditional close, overdue scan.
//! - [`close`]: the `order-close` handler ([`OrderClose`](close::OrderClose)).
//! - [`reconcile`]: the job that reschedules overdue pending orders.

pub mod close;
pub mod db;
pub mod error;
pub mod reconcile;
pub mod repo;
