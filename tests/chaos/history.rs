//! What the campaign records: every operation with the times it was sent and answered,
//! every delivery as its receiver saw it, every fault.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on this host's clock, which is the clock Redis `TIME`
/// reads on the same host (checked at start: [`crate::world::check_clock`]).
pub fn now_ms() -> i64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(d.as_millis()).unwrap()
}

/// How an operation was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// HTTP to serve number n.
    Http(usize),
    /// The library client in the test process.
    Lib,
}

/// What an operation asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Schedule (upsert) with this due time.
    Schedule { due: i64 },
    /// Move a scheduled order (library `reschedule`: never creates).
    Reschedule { due: i64 },
    /// Cancel.
    Cancel,
    /// Force-delete the queue.
    QueueDelete,
    /// Register the queue.
    QueueCreate,
    /// Declare a recurring schedule ticking every `every_s` seconds.
    CronUpsert { every_s: u32 },
    /// Remove a recurring schedule.
    CronRemove,
    /// Replay every dead letter of the queue.
    Replay,
}

/// How it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Res {
    /// Done; the outcome as named by the API (`created`, `updated`, `cancelled`,
    /// `not_found`, `rescheduled`, `removed`, ...).
    Ok(String),
    /// Definitely not applied (refused before anything was written: connection refused,
    /// `redis_unavailable`, `queue_not_found`, ...).
    Refused(String),
    /// May or may not have been applied (a timeout, a lost connection, `outcome_unknown`).
    Unknown(String),
}

impl Res {
    pub fn is_ok(&self) -> bool {
        matches!(self, Res::Ok(_))
    }
    pub fn is_unknown(&self) -> bool {
        matches!(self, Res::Unknown(_))
    }
    pub fn is_refused(&self) -> bool {
        matches!(self, Res::Refused(_))
    }
    pub fn outcome(&self) -> Option<&str> {
        match self {
            Res::Ok(o) => Some(o),
            _ => None,
        }
    }
}

/// One operation.
#[derive(Debug, Clone)]
pub struct Op {
    pub queue: String,
    /// The order or schedule id (empty for queue operations).
    pub id: String,
    pub kind: Kind,
    pub via: Via,
    pub sent_ms: i64,
    pub answered_ms: i64,
    pub res: Res,
}

/// How the receiver answered a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx (webhook) or `Ok` (library handler): the delivery is acknowledged.
    Ok,
    /// 500 (webhook) or a retryable error (library handler).
    Fail,
    /// Answered only after the handler's timeout (webhook).
    Hang,
}

/// One delivery as its receiver saw it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub queue: String,
    pub id: String,
    pub group: String,
    pub due_ms: i64,
    pub attempt: u32,
    /// When the receiver got it (host clock = Redis `TIME`).
    pub received_ms: i64,
    /// The dispatch time Redis wrote (library deliveries only).
    pub dispatched_ms: Option<i64>,
    pub answer: Answer,
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct Fault {
    pub at_ms: i64,
    pub what: String,
}

/// Everything recorded, shared by every task.
#[derive(Clone, Default)]
pub struct History {
    pub ops: Arc<Mutex<Vec<Op>>>,
    pub deliveries: Arc<Mutex<Vec<Delivery>>>,
    pub faults: Arc<Mutex<Vec<Fault>>>,
}

impl History {
    pub fn op(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }
    pub fn delivery(&self, d: Delivery) {
        self.deliveries.lock().unwrap().push(d);
    }
    pub fn fault(&self, what: String) {
        eprintln!("  fault at {}: {what}", now_ms());
        self.faults.lock().unwrap().push(Fault {
            at_ms: now_ms(),
            what,
        });
    }
}

/// A deterministic 64-bit mix (splitmix64) of the seed and the parts: the receiver's and
/// the handler's verdicts depend on the delivery, never on the order deliveries arrive in.
pub fn mix(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for p in parts {
        for b in *p {
            h = splitmix(h ^ u64::from(*b));
        }
        h = splitmix(h ^ 0xFF);
    }
    h
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
