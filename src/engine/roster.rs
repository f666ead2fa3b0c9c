//! The dispatch roster: which process dispatches which shard of a queue.
//!
//! Several processes (`serve` replicas, library dispatchers) may dispatch one queue. Each
//! shard is called by one of them, its **owner**, so adding processes adds no script calls
//! per order; the others stand by for it.
//!
//! - **Who runs.** A running dispatcher holds a [`Seat`] for its queue. Each process keeps
//!   its seats in the namespace's roster (`{ns}:dispatchers`, a ZSET of `<queue>\x01<id>`
//!   scored by an expiry on the Redis clock): one pipeline every [`ROSTER_REFRESH`] adds
//!   them again [`ROSTER_TTL`] ahead, drops the expired members of every process and reads
//!   the live ones; a seat given up is removed at once. The roster holds one member per
//!   queue per running process: bounded by the registry's queue cap times the processes
//!   (`delayq_dispatch_roster` shows its size).
//! - **Who owns a shard.** Rendezvous hashing ([`owner`]): of the processes seated at the
//!   queue, the one with the highest hash of (process, queue, shard). Every process that
//!   read the same roster agrees without talking; a process that joins or leaves moves
//!   only the shards it gains or held.
//! - **Standing by.** A process does not call a shard it does not own. It looks at its
//!   earliest order (one `ZRANGE 0 0`) when that order is `takeover_after` overdue, and
//!   when the same order is still there and overdue at the next look `takeover_after`
//!   later, it **takes the shard over** (calls it itself; `delayq_dispatch_takeovers_total`)
//!   until the shard has nothing due. A crashed owner's shards are dispatched within about
//!   twice `takeover_after`, long before its seat expires; a slow owner costs nothing worse
//!   than the calls of today's every-process-calls-every-shard.
//! - **Nothing to agree on is a reason to dispatch.** A process without a fresh roster
//!   (never read, or not read for [`ROSTER_TTL`]: Redis unreachable) or not seated in the
//!   one it read owns every shard, as does every dispatcher with `takeover_after = 0s`.
//!   Two owners of one shard are safe (`dequeue.lua` is atomic): they only cost calls.
//!
//! No lock is held across a Redis call; the roster's task runs while a seat is held.

use crate::engine::clock::Clock;
use crate::engine::conn::Conn;
use crate::engine::error::RedisContext;
use crate::engine::sync::lock;
use crate::engine::telemetry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a process renews its seats and reads the roster.
pub const ROSTER_REFRESH: Duration = Duration::from_secs(5);

/// How long a seat lives without renewal (a crashed process's seats go after this); a roster
/// read longer ago than this is not trusted (the process then owns every shard).
pub const ROSTER_TTL: Duration = Duration::from_secs(15);

/// `<host>-<pid>-<random hex>`: unique per process start (a client's id in the roster, and a
/// worker's default consumer name).
pub(crate) fn process_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.len() <= 64 && !s.chars().any(char::is_control))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    let rand = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}-{}-{:06x}", std::process::id(), rand & 0xff_ffff)
}

/// Separates the queue from the process id in a roster member.
const SEP: char = '\u{1}';

/// The owner of `queue`'s `shard` among `members` (process ids seated at the queue):
/// the highest rendezvous weight, ties to the greater id. `None` when there is no member.
pub fn owner<'a>(members: &'a [String], queue: &str, shard: u16) -> Option<&'a str> {
    members
        .iter()
        .map(|m| (weight(m, queue, shard), m.as_str()))
        .max()
        .map(|(_, m)| m)
}

/// The rendezvous weight of (`member`, `queue`, `shard`): FNV-1a over the three, with a
/// final mix so close inputs spread. Stable across processes, versions and platforms.
fn weight(member: &str, queue: &str, shard: u16) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = member
        .bytes()
        .chain([0])
        .chain(queue.bytes())
        .chain([0])
        .chain(shard.to_le_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    // splitmix64's finaliser.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Which of `shards` shards of `queue` `me` owns, given the ids seated at the queue
/// (`None`: no trusted roster, or `me` is not in it: every shard).
pub fn owned(members: Option<&[String]>, me: &str, queue: &str, shards: usize) -> Vec<bool> {
    match members {
        Some(m) if m.iter().any(|x| x == me) => (0..shards)
            .map(|s| owner(m, queue, u16::try_from(s).unwrap_or(u16::MAX)) == Some(me))
            .collect(),
        _ => vec![true; shards],
    }
}

#[derive(Debug, Default)]
struct State {
    /// Seats held, per queue.
    seats: HashMap<String, usize>,
    /// Queues whose last seat went: their members are removed by the next round.
    left: Vec<String>,
    /// Live process ids per queue, as last read.
    live: HashMap<String, Vec<String>>,
    /// When the roster was last read.
    read_at: Option<Instant>,
    /// The task is running.
    running: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
    /// Bumped by every read: a dispatcher recomputes its shards when it moved.
    version: AtomicU64,
    /// This process's id in the roster.
    id: String,
    /// The roster's key.
    key: String,
}

/// A client's view of the dispatch roster (see the module docs).
#[derive(Debug)]
pub(crate) struct Roster {
    shared: Arc<Shared>,
}

/// A dispatcher's place in the roster, held while it runs.
#[derive(Debug)]
pub(crate) struct Seat {
    shared: Arc<Shared>,
    queue: String,
}

impl Roster {
    /// A roster kept at `key` for the process `id`.
    pub(crate) fn new(key: String, id: String) -> Self {
        Roster {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                version: AtomicU64::new(0),
                id,
                key,
            }),
        }
    }

    /// Seats this process at `queue` until the seat drops; starts the roster's task (on
    /// `conn`, timed by `clock`: the client's) when it is not running. Outside a tokio
    /// runtime there is no task: the roster is never read and the process owns every shard.
    pub(crate) fn join(&self, conn: &Conn, clock: &Arc<dyn Clock>, queue: &str) -> Seat {
        let start = {
            let mut s = lock(&self.shared.state);
            *s.seats.entry(queue.to_owned()).or_default() += 1;
            s.left.retain(|q| q != queue);
            let start = !s.running && tokio::runtime::Handle::try_current().is_ok();
            s.running |= start;
            start
        };
        if start {
            tokio::spawn(run(self.shared.clone(), conn.clone(), clock.clone()));
        }
        self.shared.changed.notify_one();
        Seat {
            shared: self.shared.clone(),
            queue: queue.to_owned(),
        }
    }
}

impl Seat {
    /// The roster's version: it moves with every read.
    pub(crate) fn version(&self) -> u64 {
        self.shared.version.load(Ordering::SeqCst)
    }

    /// Which of the queue's `shards` this process owns now (see [`owned`]).
    pub(crate) fn owned(&self, shards: usize) -> Vec<bool> {
        let s = lock(&self.shared.state);
        let fresh = s.read_at.is_some_and(|t| t.elapsed() < ROSTER_TTL);
        let members = s.live.get(&self.queue).filter(|_| fresh);
        owned(
            members.map(Vec::as_slice),
            &self.shared.id,
            &self.queue,
            shards,
        )
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.shared.state);
            if let Some(n) = s.seats.get_mut(&self.queue) {
                *n -= 1;
                if *n == 0 {
                    s.seats.remove(&self.queue);
                    s.left.push(self.queue.clone());
                }
            }
        }
        self.shared.changed.notify_one();
    }
}

fn member(queue: &str, id: &str) -> String {
    format!("{queue}{SEP}{id}")
}

/// The roster's task: renews this process's seats, removes those given up, reads the live
/// members; ends (removing what is left) when no seat is held.
async fn run(shared: Arc<Shared>, conn: Conn, clock: Arc<dyn Clock>) {
    loop {
        let (seated, left) = {
            let mut s = lock(&shared.state);
            let left = std::mem::take(&mut s.left);
            if s.seats.is_empty() {
                s.running = false;
                s.live.clear();
                s.read_at = None;
            }
            (s.seats.keys().cloned().collect::<Vec<_>>(), left)
        };
        if seated.is_empty() {
            if !left.is_empty()
                && let Err(e) = round(&shared, &conn, clock.now_ms(), &[], &left).await
            {
                // Its seats expire after ROSTER_TTL; the others take over meanwhile.
                tracing::debug!(error = %e, "leaving the dispatch roster failed");
            }
            return;
        }
        match round(&shared, &conn, clock.now_ms(), &seated, &left).await {
            Ok(live) => {
                let n: usize = live.values().map(Vec::len).sum();
                telemetry::dispatch_roster(n);
                let mut s = lock(&shared.state);
                s.live = live;
                s.read_at = Some(Instant::now());
                drop(s);
                shared.version.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                // Put back what was not removed; the seats are renewed next round.
                lock(&shared.state).left.extend(left);
                tracing::debug!(error = %e, "renewing the dispatch roster failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(ROSTER_REFRESH) => {}
            _ = shared.changed.notified() => {}
        }
    }
}

/// One round: seats `seated` for another [`ROSTER_TTL`], removes the members of `left` and
/// every expired member, and reads the live ones (process ids by queue).
async fn round(
    shared: &Shared,
    conn: &Conn,
    now: i64,
    seated: &[String],
    left: &[String],
) -> crate::engine::error::Result<HashMap<String, Vec<String>>> {
    let until = now + i64::try_from(ROSTER_TTL.as_millis()).unwrap_or(15_000);
    let mut pipe = redis::pipe();
    if !seated.is_empty() {
        let cmd = pipe.cmd("ZADD").arg(&shared.key);
        for q in seated {
            cmd.arg(until).arg(member(q, &shared.id));
        }
        cmd.ignore();
    }
    if !left.is_empty() {
        let cmd = pipe.cmd("ZREM").arg(&shared.key);
        for q in left {
            cmd.arg(member(q, &shared.id));
        }
        cmd.ignore();
    }
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(&shared.key)
        .arg("-inf")
        .arg(format!("({now}"))
        .ignore();
    if seated.is_empty() {
        let mut conn = conn.clone();
        pipe.query_async::<()>(&mut conn)
            .await
            .ctx("leaving the dispatch roster")?;
        return Ok(HashMap::new());
    }
    pipe.cmd("ZRANGE")
        .arg(&shared.key)
        .arg(now)
        .arg("+inf")
        .arg("BYSCORE");
    let mut conn = conn.clone();
    let (members,): (Vec<String>,) = pipe
        .query_async(&mut conn)
        .await
        .ctx("renewing the dispatch roster")?;
    let mut live: HashMap<String, Vec<String>> = HashMap::new();
    for m in members {
        if let Some((q, id)) = m.split_once(SEP) {
            live.entry(q.to_owned()).or_default().push(id.to_owned());
        }
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("host-{i}-abc")).collect()
    }

    #[test]
    fn every_member_agrees_on_one_owner_per_shard() {
        let m = ids(3);
        for s in 0..64u16 {
            let o = owner(&m, "orders", s).map(str::to_owned);
            let mut r = m.clone();
            r.reverse();
            assert_eq!(owner(&r, "orders", s).map(str::to_owned), o);
            let mine: usize = m
                .iter()
                .filter(|me| owned(Some(&m), me, "orders", 64)[usize::from(s)])
                .count();
            assert_eq!(mine, 1, "shard {s} must have exactly one owner");
        }
    }

    #[test]
    fn shards_spread_over_the_members() {
        let m = ids(2);
        let a = owned(Some(&m), &m[0], "orders", 256)
            .iter()
            .filter(|o| **o)
            .count();
        // Rendezvous hashing: about half each (a fixed input, so a fixed answer).
        assert!((96..=160).contains(&a), "one of two owns {a} of 256 shards");
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_shards() {
        let m = ids(3);
        let rest = vec![m[0].clone(), m[2].clone()];
        for s in 0..128u16 {
            let before = owner(&m, "q", s).map(str::to_owned);
            let after = owner(&rest, "q", s).map(str::to_owned);
            if before.as_deref() != Some(m[1].as_str()) {
                assert_eq!(before, after, "shard {s} moved though its owner stayed");
            }
        }
    }

    #[test]
    fn without_a_roster_or_a_seat_in_it_a_process_owns_every_shard() {
        let m = ids(2);
        assert_eq!(owned(None, "me", "q", 4), vec![true; 4]);
        assert_eq!(owned(Some(&m), "me", "q", 4), vec![true; 4]);
        assert_eq!(owned(Some(&[]), "me", "q", 2), vec![true; 2]);
        let alone = vec!["me".to_owned()];
        assert_eq!(owned(Some(&alone), "me", "q", 3), vec![true; 3]);
    }

    #[test]
    fn queues_are_split_independently() {
        let m = ids(2);
        let a: Vec<bool> = owned(Some(&m), &m[0], "a", 64);
        let b: Vec<bool> = owned(Some(&m), &m[0], "b", 64);
        assert_ne!(a, b, "two queues must not share one assignment");
    }

    #[test]
    fn the_weight_is_stable() {
        // Every process, whatever its build, must compute the same owner.
        assert_eq!(weight("a", "q", 0), weight("a", "q", 0));
        assert_ne!(weight("a", "q", 0), weight("a", "q", 1));
        assert_ne!(weight("a", "q", 1), weight("b", "q", 1));
        // Pinned: a change would make two builds disagree on every shard's owner (during a
        // rolling deploy each would leave the other's shards to takeovers).
        assert_eq!(
            weight("host-1", "orders", 3),
            17_872_318_088_724_838_856_u64
        );
    }
}
