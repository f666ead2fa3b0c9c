//! The one clock: "now" is the Redis server's `TIME`, never a host's wall clock.
//!
//! [`RedisClock`] reads `TIME` once and then tracks the offset with the host's monotonic
//! clock, so reading "now" costs no round trip and host wall-clock jumps do not matter.
//! Every script that needs "now" gets it as an argument from a [`Clock`], which tests can
//! replace with a [`ManualClock`].

use crate::engine::error::{RedisContext, Result};
use std::sync::Mutex;
use std::time::Instant;

/// A source of "now" in unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// The current time, unix milliseconds.
    fn now_ms(&self) -> i64;

    /// The current time, unix microseconds (for measuring lateness finer than 1 ms).
    fn now_us(&self) -> i64 {
        self.now_ms().saturating_mul(1000)
    }
}

/// The Redis server's clock: `TIME` read at [`sync`](RedisClock::sync), advanced locally with
/// the monotonic clock in between.
#[derive(Debug)]
pub struct RedisClock {
    /// (host instant of the reading, Redis time at that instant in microseconds)
    base: Mutex<(Instant, i64)>,
}

impl RedisClock {
    /// Reads `TIME` from `conn` and returns a clock anchored on it.
    pub async fn new<C: redis::aio::ConnectionLike>(conn: &mut C) -> Result<Self> {
        let base = read_time(conn).await?;
        Ok(RedisClock {
            base: Mutex::new(base),
        })
    }

    /// How long ago (host monotonic time) the anchor was read.
    pub fn age(&self) -> std::time::Duration {
        self.base
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .elapsed()
    }

    /// Reads `TIME` again and re-anchors (bounds drift between host and server clocks).
    pub async fn sync<C: redis::aio::ConnectionLike>(&self, conn: &mut C) -> Result<()> {
        let base = read_time(conn).await?;
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) = base;
        Ok(())
    }
}

/// One `TIME` reading, attributed to the moment its reply was taken in: the server read its
/// clock at some point of the round trip, never after that moment, so the clock derived from
/// it is never ahead of the server's and nothing is dispatched before it is due. It can be
/// behind by up to one round trip (tens of microseconds on a healthy link). Attributing it to
/// the midpoint instead would run ahead by half of any delay on the way back: a reply held up
/// behind a frozen server (`SIGSTOP`) or a busy process put orders out up to 14 ms early in
/// the fault campaign (tests/chaos).
async fn read_time<C: redis::aio::ConnectionLike>(conn: &mut C) -> Result<(Instant, i64)> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .ctx("reading the server clock (TIME)")?;
    Ok((Instant::now(), secs * 1_000_000 + micros))
}

impl Clock for RedisClock {
    fn now_ms(&self) -> i64 {
        self.now_us() / 1000
    }

    fn now_us(&self) -> i64 {
        let (at, micros) = *self.base.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = i64::try_from(at.elapsed().as_micros()).unwrap_or(i64::MAX / 2);
        micros + elapsed
    }
}

/// A clock that only moves when told to: for tests (feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct ManualClock {
    ms: std::sync::atomic::AtomicI64,
}

#[cfg(any(test, feature = "test-util"))]
impl ManualClock {
    /// A clock showing `ms`.
    pub fn new(ms: i64) -> Self {
        ManualClock {
            ms: std::sync::atomic::AtomicI64::new(ms),
        }
    }

    /// Sets the time.
    pub fn set(&self, ms: i64) {
        self.ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: std::time::Duration) {
        let d = i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2);
        self.ms.fetch_add(d, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}
