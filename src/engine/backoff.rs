//! Backoff policies: how long a failed order waits before its next attempt.

use crate::engine::duration::parse_duration;
use crate::engine::error::InvalidInput;
use std::time::Duration;

/// The shortest delay a backoff policy may give.
pub const MIN_BACKOFF: Duration = Duration::from_millis(10);

/// The delay before the next attempt, given how many attempts failed so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backoff {
    /// Always the same delay (`fixed:5s`).
    Fixed(Duration),
    /// `a·n + b` after the n-th failed attempt (`linear:2m:1m` = 3 min, 5 min, 7 min, ...:
    /// the classic "notify every 2n+1 minutes").
    Linear {
        /// Grows by this much per attempt.
        a: Duration,
        /// The constant part.
        b: Duration,
    },
    /// `base·2^(n-1)`, at most `cap`, with "equal jitter": a random delay between half and all
    /// of that (`exponential:1s:10m`), so failed orders do not retry in lockstep.
    Exponential {
        /// The first delay.
        base: Duration,
        /// The largest delay.
        cap: Duration,
    },
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::Exponential {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The delay after the `failed_attempts`-th failed attempt (from 1).
    pub fn delay(&self, failed_attempts: u32) -> Duration {
        let n = failed_attempts.max(1);
        match *self {
            Backoff::Fixed(d) => d,
            Backoff::Linear { a, b } => a.saturating_mul(n).saturating_add(b),
            Backoff::Exponential { base, cap } => {
                let exp = base.saturating_mul(1u32 << (n - 1).min(30)).min(cap);
                let half = exp / 2;
                half + half.mul_f64(fastrand::f64())
            }
        }
    }

    /// Parses `fixed:<d>`, `linear:<a>:<b>` or `exponential:<base>:<cap>`, durations like
    /// `5s`, `2m`, `1h30m`.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: String| InvalidInput::Option {
            name: "backoff",
            reason,
        };
        let parts: Vec<&str> = text.trim().split(':').collect();
        let d = |s: &str| parse_duration("backoff", s);
        let b = match parts.as_slice() {
            ["fixed", x] => Backoff::Fixed(d(x)?),
            ["linear", a, b] => Backoff::Linear { a: d(a)?, b: d(b)? },
            ["exponential", base, cap] => Backoff::Exponential {
                base: d(base)?,
                cap: d(cap)?,
            },
            _ => {
                return Err(bad(format!(
                    "{text:?} is not fixed:<d>, linear:<a>:<b> or exponential:<base>:<cap>"
                )));
            }
        };
        b.validate().map_err(|e| match e {
            InvalidInput::Option { reason, .. } => bad(format!("{text:?}: {reason}")),
            other => other,
        })?;
        Ok(b)
    }

    /// Checks the policy (the one place its ranges are written): its first delay is at
    /// least [`MIN_BACKOFF`] (a zero delay would retry a failing order in a tight loop), and
    /// an exponential cap is at least its base.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |reason: String| {
            Err(InvalidInput::Option {
                name: "backoff",
                reason,
            })
        };
        match *self {
            Backoff::Fixed(d) if d < MIN_BACKOFF => {
                bad(format!("the delay must be at least {MIN_BACKOFF:?}"))
            }
            Backoff::Linear { a, b } if a + b < MIN_BACKOFF => bad(format!(
                "the first delay (a + b) must be at least {MIN_BACKOFF:?}"
            )),
            Backoff::Exponential { base, cap } if base < MIN_BACKOFF * 2 || cap < base => {
                bad(format!(
                    "base must be at least {:?} and cap at least base",
                    MIN_BACKOFF * 2
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies() {
        let s = Duration::from_secs;
        assert_eq!(Backoff::parse("fixed:5s").unwrap().delay(7), s(5));
        let lin = Backoff::parse("linear:2m:1m").unwrap();
        assert_eq!(
            (1..=3).map(|n| lin.delay(n)).collect::<Vec<_>>(),
            vec![s(180), s(300), s(420)]
        );
        let exp = Backoff::parse("exponential:1s:10m").unwrap();
        for n in 1..=40 {
            let d = exp.delay(n);
            let full = s(1).saturating_mul(1 << (n - 1).min(30)).min(s(600));
            assert!(d >= full / 2 && d <= full, "attempt {n}: {d:?} vs {full:?}");
        }
        for bad in [
            "fixed",
            "fixed:-1s",
            "linear:2m",
            "exponential:0s:1m",
            "exponential:1m:1s",
            "x:1s",
            "fixed:0s",
            "fixed:9ms",
            "linear:0s:0s",
            "exponential:10ms:1s",
            "fixed:200000000000d",
        ] {
            assert!(Backoff::parse(bad).is_err(), "{bad}");
        }
    }
}
