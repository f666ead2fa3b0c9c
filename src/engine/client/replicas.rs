//! How many replicas a durable write waits for with [`Durability::EveryReplica`]: every
//! replica the master has had lately, learned from its `INFO replication` and cached with
//! bounds (see [`ReplicaCounts`]).
//!
//! Why every replica, and why the count only falls slowly: after a `SENTINEL FAILOVER`
//! the promoted replica stops following the old master at once, while the old master
//! stays a master (with its other replicas) until the sentinels demote it. A `WAIT` for
//! *one* replica is still met there by a replica that will be resynced from the new
//! master, so the write is acknowledged and then discarded. A `WAIT` for every replica the
//! master had cannot be met once one of them was promoted: the write is answered
//! `not_replicated` (retry-safe) instead. Were the count to follow the master's own figure
//! at once, it would drop with the promotion and open the same hole again: a lower figure
//! is believed only after it held for [`REPLICA_COUNT_HOLD`].
//!
//! [`Durability::EveryReplica`]: super::Durability::EveryReplica

use crate::engine::conn::Conn;
use crate::engine::error::{RedisContext, Result};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long a master must report fewer replicas than it had before a durable write waits
/// for fewer. It must outlast the time from a replica's promotion until no connection
/// writes to the old master any more: the sentinels reconfigure the old master's other
/// replicas about a second after the promotion (measured: they name the new master
/// 1.0–1.2 s after `SENTINEL FAILOVER`), and the watcher moves every connection within its
/// interval after that. The cost: after a replica is lost for good (or leaves for a
/// restart), every durable write is answered `not_replicated` for this long.
pub const REPLICA_COUNT_HOLD: Duration = Duration::from_secs(10);

/// How old a connection's figure may be before a durable write asks the master again
/// (`INFO replication`, one round trip). A replica that attached in this time is not
/// waited for yet: the sentinels learn of replicas from the master's `INFO` every 10 s, so
/// they would not promote it sooner.
pub const REPLICA_COUNT_REFRESH: Duration = Duration::from_secs(1);

/// Most masters remembered (the set's members, each by replication ID: a promotion gives
/// the new master a new one); the oldest is forgotten first.
const MASTERS_REMEMBERED: usize = 16;

/// What the client learned of each master's replicas, by the master's replication ID.
/// Shared by every durable connection of a client, so that a connection opened after a
/// promotion does not learn the old master's lower figure afresh. The mutex is held only
/// to read or update the figures, never across a Redis call.
#[derive(Default)]
pub(super) struct ReplicaCounts {
    masters: Mutex<Vec<Learned>>,
}

/// One master's figures.
#[derive(Debug, Clone)]
struct Learned {
    replid: String,
    /// Most replicas in sync seen (lowered only after a lower figure held for
    /// [`REPLICA_COUNT_HOLD`]).
    most: u32,
    /// Since when the master reports fewer than `most`.
    lower_since: Option<Instant>,
    /// When this master was last asked.
    seen: Instant,
}

/// What a master's `INFO replication` says: its replication ID and how many replicas are
/// in sync (`state=online`); `None` when the server is not a master.
pub(super) fn parse_replication(info: &str) -> Option<(String, u32)> {
    let mut master = false;
    let mut replid = None;
    let mut online = 0u32;
    for line in info.lines().map(str::trim) {
        if let Some(role) = line.strip_prefix("role:") {
            master = role == "master";
        } else if let Some(id) = line.strip_prefix("master_replid:") {
            replid = Some(id.to_owned());
        } else if line.starts_with("slave")
            && line.split_once(':').is_some_and(|(name, fields)| {
                name.len() > 5
                    && name[5..].bytes().all(|b| b.is_ascii_digit())
                    && fields.split(',').any(|f| f == "state=online")
            })
        {
            online = online.saturating_add(1);
        }
    }
    match (master, replid) {
        (true, Some(id)) => Some((id, online)),
        _ => None,
    }
}

impl ReplicaCounts {
    /// Records that the master `replid` reports `online` replicas in sync at `now`; returns
    /// how many replicas a durable write on it waits for (the most it had, unless fewer
    /// held for [`REPLICA_COUNT_HOLD`]).
    pub(super) fn observe(&self, replid: &str, online: u32, now: Instant) -> u32 {
        let mut masters = self.masters.lock().unwrap_or_else(|p| p.into_inner());
        let i = match masters.iter().position(|m| m.replid == replid) {
            Some(i) => i,
            None => {
                if masters.len() >= MASTERS_REMEMBERED
                    && let Some(oldest) = masters
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, m)| m.seen)
                        .map(|(i, _)| i)
                {
                    masters.swap_remove(oldest);
                }
                masters.push(Learned {
                    replid: replid.to_owned(),
                    most: online,
                    lower_since: None,
                    seen: now,
                });
                masters.len() - 1
            }
        };
        let m = &mut masters[i];
        m.seen = now;
        if online >= m.most {
            m.most = online;
            m.lower_since = None;
        } else {
            let since = *m.lower_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= REPLICA_COUNT_HOLD {
                m.most = online;
                m.lower_since = None;
            }
        }
        m.most
    }

    /// How many masters are remembered (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.masters.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A durable connection's figure: how many replicas its master wants confirmations from,
/// and when it was learned. The mutex is held only to read or store it.
#[derive(Default)]
pub(super) struct ConnFigure {
    learned: Mutex<Option<(Instant, u32)>>,
}

impl ConnFigure {
    /// How many replicas a durable write on `conn` waits for: at least `min`, and every
    /// replica its master has had lately ([`ReplicaCounts::observe`]), asked again once the
    /// figure is older than [`REPLICA_COUNT_REFRESH`]. A server that is not a master (a
    /// demoted one, or a replica the sentinels still name) gets `min`: the write is refused
    /// `READONLY` there anyway.
    pub(super) async fn replicas(
        &self,
        counts: &ReplicaCounts,
        conn: &Conn,
        min: u32,
    ) -> Result<u32> {
        let now = Instant::now();
        let cached = *self.learned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, n)) = cached
            && now.saturating_duration_since(at) < REPLICA_COUNT_REFRESH
        {
            return Ok(n.max(min));
        }
        let mut conn = conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .ctx(
                "learning the master's replicas for durability = every replica (INFO replication)",
            )?;
        let n = match parse_replication(&info) {
            Some((replid, online)) => counts.observe(&replid, online, Instant::now()),
            None => min,
        };
        *self.learned.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), n));
        Ok(n.max(min))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
        min_slaves_good_slaves:2\r\n\
        slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n\
        slave1:ip=127.0.0.1,port=7002,state=online,offset=10,lag=1\r\n\
        slave2:ip=127.0.0.1,port=7003,state=wait_bgsave,offset=0,lag=0\r\n\
        master_failover_state:no-failover\r\n\
        master_replid:aaaa\r\nmaster_replid2:0000\r\nslave_read_only:1\r\n";

    #[test]
    fn info_replication_gives_the_replid_and_the_replicas_in_sync() {
        assert_eq!(parse_replication(TWO), Some(("aaaa".to_owned(), 2)));
        let bare = "role:master\r\nconnected_slaves:0\r\nmaster_replid:bbbb\r\n";
        assert_eq!(parse_replication(bare), Some(("bbbb".to_owned(), 0)));
        // A replica's own fields (slave_read_only, slave_repl_offset...) are not replicas.
        let replica = "role:slave\r\nmaster_host:127.0.0.1\r\nslave_repl_offset:5\r\n\
            slave_read_only:1\r\nmaster_replid:cccc\r\n";
        assert_eq!(parse_replication(replica), None);
        assert_eq!(parse_replication(""), None);
    }

    #[test]
    fn a_lower_figure_is_believed_only_after_it_held() {
        let counts = ReplicaCounts::default();
        let t0 = Instant::now();
        assert_eq!(counts.observe("m", 2, t0), 2);
        // The promoted replica left: the old master still waits for two.
        assert_eq!(counts.observe("m", 1, t0 + Duration::from_millis(100)), 2);
        let held = t0 + Duration::from_millis(100) + REPLICA_COUNT_HOLD;
        assert_eq!(counts.observe("m", 1, held - Duration::from_millis(1)), 2);
        assert_eq!(counts.observe("m", 1, held), 1);
        // A figure back up resets the hold; more replicas count at once.
        assert_eq!(counts.observe("m", 3, held), 3);
        assert_eq!(counts.observe("m", 2, held + Duration::from_secs(1)), 3);
        assert_eq!(counts.observe("m", 3, held + Duration::from_secs(2)), 3);
        assert_eq!(
            counts.observe(
                "m",
                2,
                held + Duration::from_secs(2) + REPLICA_COUNT_HOLD / 2
            ),
            3,
            "the hold starts again after the figure came back"
        );
        // Another master (a promotion gives a new replication ID) is learned on its own.
        assert_eq!(counts.observe("n", 0, held), 0);
        assert_eq!(counts.observe("m", 3, held), 3);
    }

    #[test]
    fn the_masters_remembered_are_bounded() {
        let counts = ReplicaCounts::default();
        let t0 = Instant::now();
        for i in 0..(MASTERS_REMEMBERED as u64 * 2) {
            counts.observe(&format!("m{i}"), 1, t0 + Duration::from_millis(i));
        }
        assert_eq!(counts.len(), MASTERS_REMEMBERED);
        // The most recent are kept.
        let last = format!("m{}", MASTERS_REMEMBERED * 2 - 1);
        assert_eq!(counts.observe(&last, 0, t0 + Duration::from_secs(1)), 1);
    }
}
