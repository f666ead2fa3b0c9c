//! Queue administration: the operator's side of the engine, apart from the producer's
//! [`Client`]. [`Queues`] (from [`Client::admin`]) creates, lists and deletes queues and
//! groups ([`queues`]; a new queue with all its settings at once: [`QueueSettings`]),
//! records what consumes a group ([`kinds`]), pauses and resumes them, sets their history
//! retention and default `expires_after`, reads their statistics ([`stats`]), a group's order keys in use
//! ([`keys`]), an order's history and redelivers it ([`history`]), and lists, replays and purges dead letters
//! ([`dead`]). The HTTP API, the CLI and the dashboard call it directly and serialize its
//! types; the rules only those surfaces apply (batch caps, page limits, selections) live in
//! `service::surface`.
//!
//! It holds nothing but the client (one connection, shared), so making one is free. Nothing
//! here is used by the producer path or the background loops' hot paths; the loops read the
//! registry through the client's catalog (`engine::client::catalog`).

pub mod dead;
mod events;
mod expiry;
pub mod history;
pub mod keys;
pub mod kinds;
pub mod queues;
mod settings;
pub mod stats;

pub use queues::{GROUP_ALIVE_WITHIN, QueueContents, QueueInfo};
pub use settings::QueueSettings;

use crate::engine::client::Client;

/// The administration of one namespace's queues, over a [`Client`]'s connection.
#[derive(Clone)]
pub struct Queues {
    client: Client,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("namespace", &self.client.keyspace().namespace())
            .finish()
    }
}

impl Queues {
    /// The administration of `client`'s namespace (shares its connection).
    pub fn new(client: &Client) -> Queues {
        Queues {
            client: client.clone(),
        }
    }

    /// The client it administers through.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Client {
    /// The administration of this client's namespace: [`Queues`].
    pub fn admin(&self) -> Queues {
        Queues::new(self)
    }
}
