//! The one retry helper for transient Redis failures.
//!
//! Two shapes cover every loop that talks to Redis:
//! - [`with_retries`]: a call that must succeed soon or be given up on (settling an entry,
//!   acknowledging): a few attempts with doubling delays, then the error;
//! - [`Pacer`]: a background loop that never gives up (reading, dispatching, connecting):
//!   it waits a doubling delay after each failure, reset by a success, and stops waiting
//!   when cancelled.
//!
//! Whether an error is worth retrying is [`Error::is_transient`](crate::Error::is_transient).

use crate::engine::error::Result;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Delays between attempts: `first`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first delay.
    pub first: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Most attempts, the first included ([`with_retries`] only).
    pub attempts: u32,
}

impl RetryPolicy {
    /// For calls that settle work (ack, retry, dead letter): 5 attempts, 50 ms doubling
    /// (about 750 ms of waiting in all).
    pub const CALL: RetryPolicy = RetryPolicy {
        first: Duration::from_millis(50),
        max: Duration::from_secs(1),
        attempts: 5,
    };

    /// For background loops (dispatch, reads, connects): 100 ms doubling up to 5 s, forever.
    pub const LOOP: RetryPolicy = RetryPolicy {
        first: Duration::from_millis(100),
        max: Duration::from_secs(5),
        attempts: u32::MAX,
    };
}

/// Runs `f` until it succeeds, fails with an error that is not transient, or has failed
/// `policy.attempts` times; returns its last result. Stops early (returning the last error)
/// when `cancel` fires during a wait.
pub async fn with_retries<T, F, Fut>(
    what: &str,
    policy: RetryPolicy,
    cancel: Option<&CancellationToken>,
    mut f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut pacer = Pacer::new(policy);
    let mut attempt = 1;
    loop {
        match f().await {
            Err(e) if e.is_transient() && attempt < policy.attempts => {
                tracing::warn!(%what, error = %e, delay = ?pacer.next, "retrying");
                if !pacer.wait(cancel).await {
                    return Err(e);
                }
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The delay state of a loop that retries forever.
#[derive(Debug, Clone)]
pub struct Pacer {
    policy: RetryPolicy,
    next: Duration,
}

impl Pacer {
    /// A pacer starting at `policy.first`.
    pub fn new(policy: RetryPolicy) -> Self {
        Pacer {
            policy,
            next: policy.first,
        }
    }

    /// The delay the next [`wait`](Pacer::wait) will sleep.
    pub fn next_delay(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure waits `policy.first` again.
    pub fn reset(&mut self) {
        self.next = self.policy.first;
    }

    /// Sleeps the current delay and doubles it (up to `policy.max`). Returns false, at once,
    /// when `cancel` fires.
    pub async fn wait(&mut self, cancel: Option<&CancellationToken>) -> bool {
        let delay = self.next;
        self.next = (self.next * 2).min(self.policy.max);
        match cancel {
            Some(c) => tokio::select! {
                _ = tokio::time::sleep(delay) => true,
                _ = c.cancelled() => false,
            },
            None => {
                tokio::time::sleep(delay).await;
                true
            }
        }
    }
}

/// Retries `f` with [`RetryPolicy::LOOP`] while it fails with a transient error, until
/// `cancel` fires (`Ok(None)`); an error that is not transient is returned at once.
pub async fn until_ok<T, F, Fut>(
    what: &str,
    cancel: &CancellationToken,
    mut f: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut pacer = Pacer::new(RetryPolicy::LOOP);
    loop {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        match f().await {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.as_invalid().is_some() || !e.is_transient() => return Err(e),
            Err(e) => {
                tracing::warn!(%what, error = %e, retry_in = ?pacer.next_delay(), "failed; retrying");
                if !pacer.wait(Some(cancel)).await {
                    return Ok(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::error::Error;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn transient() -> Error {
        Error::Redis {
            context: "test",
            source: redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_policy_attempts() {
        let calls = AtomicU32::new(0);
        let r: Result<()> = with_retries("t", RetryPolicy::CALL, None, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(transient()) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), RetryPolicy::CALL.attempts);
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_retry_a_permanent_error() {
        let calls = AtomicU32::new(0);
        let r: Result<()> = with_retries("t", RetryPolicy::CALL, None, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                Err(Error::Reply {
                    context: "t",
                    detail: "x".into(),
                })
            }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn until_ok_stops_on_cancel() {
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let calls = AtomicU32::new(0);
        let r: Result<Option<()>> = until_ok("t", &cancel, || {
            if calls.fetch_add(1, Ordering::SeqCst) == 2 {
                c2.cancel();
            }
            async { Err(transient()) }
        })
        .await;
        assert!(matches!(r, Ok(None)));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn pacer_doubles_up_to_max_and_resets() {
        let mut p = Pacer::new(RetryPolicy::LOOP);
        let mut seen = Vec::new();
        for _ in 0..8 {
            seen.push(p.next_delay());
            p.next = (p.next * 2).min(p.policy.max);
        }
        assert_eq!(seen[0], Duration::from_millis(100));
        assert_eq!(seen[7], Duration::from_secs(5));
        p.reset();
        assert_eq!(p.next_delay(), Duration::from_millis(100));
    }
}
