//! Backoff policies: how long a failed order waits before its next attempt.

use crate::engine::duration::parse_duration;
use crate::error::InvalidInput;
use std::time::Duration;

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
        match parts.as_slice() {
            ["fixed", x] => Ok(Backoff::Fixed(d(x)?)),
            ["linear", a, b] => Ok(Backoff::Linear { a: d(a)?, b: d(b)? }),
            ["exponential", base, cap] => {
                let (base, cap) = (d(base)?, d(cap)?);
                if base.is_zero() || cap < base {
                    return Err(bad(format!("{text:?}: base must be > 0 and cap >= base")));
                }
                Ok(Backoff::Exponential { base, cap })
            }
            _ => Err(bad(format!(
                "{text:?} is not fixed:<d>, linear:<a>:<b> or exponential:<base>:<cap>"
            ))),
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
        ] {
            assert!(Backoff::parse(bad).is_err(), "{bad}");
        }
    }
}
