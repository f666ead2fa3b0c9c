//! Timing every Redis call delayq makes ([`REDIS_CALL_SECONDS`], labelled by script) and
//! counting its errors by kind ([`REDIS_ERRORS_TOTAL`], [`redis_error_kind`]).

use super::{REDIS_CALL_SECONDS, REDIS_ERRORS_TOTAL};
use std::sync::OnceLock;

/// Registration data of the Redis round-trip histogram (what `metrics::histogram!` makes).
static REDIS_CALL_META: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The `op` values: `other`, then every script of `lua/` by name; the SHA1s each script is
/// run by (both forms of a read-only one); one histogram key per `op`, made once, so that
/// timing a call allocates no label.
struct RedisOps {
    names: Vec<&'static str>,
    by_sha: std::collections::HashMap<Box<[u8]>, usize>,
    keys: Vec<metrics::Key>,
}

static REDIS_OPS: OnceLock<RedisOps> = OnceLock::new();

fn redis_ops() -> &'static RedisOps {
    REDIS_OPS.get_or_init(|| {
        use crate::engine::scripts;
        let mut names = vec!["other"];
        let mut by_sha = std::collections::HashMap::new();
        for (name, text) in scripts::flagged() {
            for form in [text, scripts::legacy(text)] {
                by_sha.insert(scripts::sha1_of(form).into_bytes().into(), names.len());
            }
            names.push(name);
        }
        let keys = names
            .iter()
            .map(|n| {
                metrics::Key::from_parts(
                    REDIS_CALL_SECONDS,
                    vec![metrics::Label::from_static_parts("op", n)],
                )
            })
            .collect();
        RedisOps {
            names,
            by_sha,
            keys,
        }
    })
}

/// What one Redis call is, for the `op` label: a script of `lua/` (by name), any other
/// command or pipeline (`other`), or a blocking command (`XREAD ... BLOCK`, `WAIT`, `BLPOP`
/// ...), whose time is waiting, not a round trip: it is not timed (its errors are counted,
/// as `op="blocking"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOp(Option<usize>);

impl RedisOp {
    const BLOCKING: RedisOp = RedisOp(None);

    /// The op of one command.
    pub fn of(cmd: &redis::Cmd) -> RedisOp {
        use redis::Arg;
        let mut args = cmd.args_iter().map(|a| match a {
            Arg::Simple(b) => b,
            _ => &b""[..],
        });
        let Some(name) = args.next() else {
            return RedisOp(Some(0));
        };
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("EVALSHA") || is("EVALSHA_RO") {
            let i = args
                .next()
                .and_then(|sha| redis_ops().by_sha.get(sha).copied());
            return RedisOp(Some(i.unwrap_or(0)));
        }
        let blocking = match name.first().map(u8::to_ascii_uppercase) {
            Some(b'X') if is("XREAD") || is("XREADGROUP") => {
                args.any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
            }
            Some(b'W') => is("WAIT") || is("WAITAOF"),
            Some(b'B') => [
                "BLPOP",
                "BRPOP",
                "BLMOVE",
                "BRPOPLPUSH",
                "BLMPOP",
                "BZPOPMIN",
                "BZPOPMAX",
                "BZMPOP",
            ]
            .iter()
            .any(|n| is(n)),
            _ => false,
        };
        if blocking {
            RedisOp::BLOCKING
        } else {
            RedisOp(Some(0))
        }
    }

    /// The op of a pipeline: blocking when one of its commands is, else its first script's,
    /// else `other`.
    pub fn of_pipeline(pipeline: &redis::Pipeline) -> RedisOp {
        let mut op = RedisOp(Some(0));
        for cmd in pipeline.cmd_iter() {
            match RedisOp::of(cmd) {
                RedisOp::BLOCKING => return RedisOp::BLOCKING,
                RedisOp(Some(0)) => {}
                script if op == RedisOp(Some(0)) => op = script,
                _ => {}
            }
        }
        op
    }

    /// The `op` label.
    pub fn label(self) -> &'static str {
        match self.0 {
            None => "blocking",
            Some(i) => redis_ops().names[i],
        }
    }

    fn record(self, seconds: f64) {
        if let Some(i) = self.0 {
            let key = &redis_ops().keys[i];
            metrics::with_recorder(|r| r.register_histogram(key, &REDIS_CALL_META)).record(seconds);
        }
    }
}

/// The `kind` of a Redis error: `timeout` (no reply within the response timeout),
/// `connection` (refused, dropped, unreachable: no reply), `busy` (`BUSY` a long script,
/// `LOADING` a dataset, `TRYAGAIN`, `CLUSTERDOWN`), `readonly` (`READONLY`, `NOREPLICAS`,
/// `MASTERDOWN`, `UNBLOCKED`: a failover, or too few replicas), `oom` (`OOM`: `maxmemory`
/// reached), `noscript` (`NOSCRIPT`: the script cache was emptied by a restart or `SCRIPT
/// FLUSH`; the script is loaded again at once), `denied` (`NOAUTH`, `WRONGPASS`, `NOPERM`),
/// `reply` (any other error reply: Redis refused that one command, e.g. delayq's own
/// script refusals such as `queue_not_found`, or `XINFO` of a stream not made yet), `other`
/// (a reply the client could not read).
pub fn redis_error_kind(e: &redis::RedisError) -> &'static str {
    use redis::ErrorKind;
    if e.is_timeout() {
        return "timeout";
    }
    if let Some(code) = e.code() {
        return redis_reply_kind(code);
    }
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::EmptySentinelList
                | ErrorKind::InvalidClientConfig
        )
    {
        return "connection";
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        return "denied";
    }
    "other"
}

/// The `kind` of an error reply, by its code (see [`redis_error_kind`]).
pub(super) fn redis_reply_kind(code: &str) -> &'static str {
    match code {
        "NOSCRIPT" => "noscript",
        "BUSY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN" => "busy",
        "READONLY" | "NOREPLICAS" | "MASTERDOWN" | "UNBLOCKED" => "readonly",
        "OOM" => "oom",
        "NOAUTH" | "WRONGPASS" | "NOPERM" => "denied",
        _ => "reply",
    }
}

fn redis_error(op: RedisOp, kind: &'static str) {
    metrics::counter!(REDIS_ERRORS_TOTAL, "op" => op.label(), "kind" => kind).increment(1);
}

/// The error replies inside what a connection answered.
pub trait RedisReply {
    /// Calls `f` with the code of every error reply in it.
    fn error_codes(&self, f: &mut dyn FnMut(&str));
}

impl RedisReply for redis::Value {
    fn error_codes(&self, f: &mut dyn FnMut(&str)) {
        if let redis::Value::ServerError(e) = self {
            f(e.code());
        }
    }
}

impl RedisReply for Vec<redis::Value> {
    fn error_codes(&self, f: &mut dyn FnMut(&str)) {
        for v in self {
            v.error_codes(f);
        }
    }
}

/// `call` (one command or pipeline of `op`), timed into [`REDIS_CALL_SECONDS`] when Redis
/// answered (a value or an error reply), its errors counted in [`REDIS_ERRORS_TOTAL`]. A
/// call its caller abandons (dropped before the reply) is not recorded.
pub fn timed_redis_call<'a, T: RedisReply + Send + 'a>(
    op: RedisOp,
    call: redis::RedisFuture<'a, T>,
) -> redis::RedisFuture<'a, T> {
    Box::pin(async move {
        let start = std::time::Instant::now();
        let r = call.await;
        match &r {
            Ok(v) => {
                op.record(start.elapsed().as_secs_f64());
                v.error_codes(&mut |code| redis_error(op, redis_reply_kind(code)));
            }
            Err(e) => {
                if e.code().is_some() {
                    op.record(start.elapsed().as_secs_f64());
                }
                redis_error(op, redis_error_kind(e));
            }
        }
        r
    })
}
