//! The Sentinel connection's decisions (pure: no I/O, unit-tested): what a call's answer
//! means for the connection ([`judge`]), and whether and when to try again ([`Attempts`]).
//! [`super::sentinel`] does the I/O.

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use std::time::Duration;
use tokio::time::Instant;

/// The error codes of a call a server refused for its role or state: nothing was done; the
/// master is resolved again and the call retried.
pub(super) const REFUSED_FOR_ROLE: [&str; 5] = [
    "READONLY",
    "UNBLOCKED",
    "MASTERDOWN",
    "NOREPLICAS",
    "LOADING",
];

/// Most attempts of one call at getting an answer from a master.
pub(super) const SENTINEL_ATTEMPTS: u32 = 12;
/// The first wait between attempts (doubling).
pub(super) const SENTINEL_FIRST_DELAY: Duration = Duration::from_millis(50);
/// The longest wait between attempts.
pub(super) const SENTINEL_MAX_DELAY: Duration = Duration::from_millis(500);

/// True when a reply (one, or any of a pipeline's) says the server refused the call for its
/// role or state during a failover, so that nothing was done and another master (or the
/// same one a moment later) may take it: a replica (`READONLY`, `UNBLOCKED`, `MASTERDOWN`),
/// a master that fewer replicas than its `min-replicas-to-write` follow (`NOREPLICAS`: the
/// old master of a failover, or a new one before a replica follows it), a server loading
/// its data (`LOADING`).
pub(super) fn refused_for_role(replies: &[Value]) -> bool {
    replies
        .iter()
        .any(|v| matches!(v, Value::ServerError(e) if REFUSED_FOR_ROLE.contains(&e.code())))
}

/// True for a failure that waiting does not fix: a TLS or client configuration error, a
/// refused login or permission.
pub(super) fn is_permanent(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidClientConfig
            | ErrorKind::AuthenticationFailed
            | ErrorKind::Server(ServerErrorKind::NoPerm)
    )
}

/// What a call's outcome means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// An answer from the master: return it.
    Answer,
    /// Refused for the server's role or state: nothing was done; resolve the master again
    /// and retry (while [`Attempts`] allows).
    Refused,
    /// The connection broke or timed out: the call may have run, so its error is returned
    /// (the caller retries what is idempotent), and the next call resolves the master again.
    MayHaveRun,
    /// Any other error: returned; the connection stays.
    Failed,
}

/// Judges a call's outcome: its replies, or the error it failed with.
pub(super) fn judge(sent: Result<&[Value], &RedisError>) -> Verdict {
    match sent {
        Ok(replies) if refused_for_role(replies) => Verdict::Refused,
        Ok(_) => Verdict::Answer,
        Err(e) if e.is_unrecoverable_error() || e.is_timeout() || e.is_connection_dropped() => {
            Verdict::MayHaveRun
        }
        Err(_) => Verdict::Failed,
    }
}

/// The attempts of one call within its deadline: at most [`SENTINEL_ATTEMPTS`], waiting
/// [`SENTINEL_FIRST_DELAY`] then doubling up to [`SENTINEL_MAX_DELAY`], never past the
/// deadline.
#[derive(Debug)]
pub(super) struct Attempts {
    attempt: u32,
    delay: Duration,
    deadline: Instant,
}

impl Attempts {
    /// No attempt made yet, for a call due by `deadline`.
    pub(super) fn new(deadline: Instant) -> Self {
        Attempts {
            attempt: 0,
            delay: SENTINEL_FIRST_DELAY,
            deadline,
        }
    }

    /// Counts an attempt starting.
    pub(super) fn start(&mut self) {
        self.attempt += 1;
    }

    /// After a failed attempt at `now`: how long to wait before the next one, or `None`
    /// to give up (a permanent failure, the last attempt, or a wait that would end past the
    /// deadline).
    pub(super) fn after_failure(&mut self, permanent: bool, now: Instant) -> Option<Duration> {
        if permanent || self.attempt >= SENTINEL_ATTEMPTS || now + self.delay >= self.deadline {
            return None;
        }
        let wait = self.delay;
        self.delay = (self.delay * 2).min(SENTINEL_MAX_DELAY);
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the server sends it (RESP), e.g. `-NOREPLICAS ...` or `+OK`.
    fn reply(resp: &str) -> Value {
        redis::parse_redis_value(format!("{resp}\r\n").as_bytes()).unwrap_or(Value::Nil)
    }

    #[test]
    fn a_refusal_for_the_server_s_role_anywhere_in_a_pipeline_is_retried_elsewhere() {
        for code in REFUSED_FOR_ROLE {
            let refused = reply(&format!("-{code} refused"));
            assert!(
                matches!(refused, Value::ServerError(_)),
                "{code}: {refused:?}"
            );
            assert_eq!(
                judge(Ok(&[reply("+OK"), refused])),
                Verdict::Refused,
                "{code}"
            );
        }
        // Another server error is the call's own answer (a script's, say).
        let own = [reply("-ERR delayq queue_not_found")];
        assert_eq!(judge(Ok(&own)), Verdict::Answer);
        assert_eq!(judge(Ok(&[reply(":1")])), Verdict::Answer);
    }

    #[test]
    fn a_broken_or_timed_out_call_may_have_run_and_other_errors_keep_the_connection() {
        let io = |k| RedisError::from(std::io::Error::new(k, "x"));
        for k in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
        ] {
            assert_eq!(judge(Err(&io(k))), Verdict::MayHaveRun, "{k:?}");
        }
        let typed = RedisError::from((ErrorKind::UnexpectedReturnType, "not a number"));
        assert_eq!(judge(Err(&typed)), Verdict::Failed);
    }

    #[test]
    fn only_configuration_login_and_permission_failures_are_permanent() {
        assert!(is_permanent(&RedisError::from((
            ErrorKind::AuthenticationFailed,
            "x"
        ))));
        assert!(is_permanent(&RedisError::from((
            ErrorKind::InvalidClientConfig,
            "x"
        ))));
        assert!(!is_permanent(&RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "x"
        ))));
    }

    #[test]
    fn attempts_double_their_wait_up_to_a_cap_and_stop_at_the_count_or_the_deadline() {
        let now = Instant::now();
        let mut a = Attempts::new(now + Duration::from_secs(3600));
        let mut waits = Vec::new();
        loop {
            a.start();
            match a.after_failure(false, now) {
                Some(w) => waits.push(w.as_millis()),
                None => break,
            }
        }
        assert_eq!(waits.len(), SENTINEL_ATTEMPTS as usize - 1, "{waits:?}");
        assert_eq!(waits[..5], [50, 100, 200, 400, 500]);
        assert!(waits.iter().all(|w| *w <= SENTINEL_MAX_DELAY.as_millis()));
        // A permanent failure stops at once; so does a wait that would end past the deadline.
        let mut a = Attempts::new(now + Duration::from_secs(3600));
        a.start();
        assert_eq!(a.after_failure(true, now), None);
        let mut a = Attempts::new(now + Duration::from_millis(120));
        a.start();
        assert_eq!(a.after_failure(false, now), Some(SENTINEL_FIRST_DELAY));
        a.start();
        let later = now + SENTINEL_FIRST_DELAY;
        assert_eq!(
            a.after_failure(false, later),
            None,
            "50 + 100 ms passes the deadline"
        );
    }
}
