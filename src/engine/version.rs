//! The Redis server's version, checked once at connect: below [`MIN_VERSION`] a clear
//! error names the version found and the one required.
//!
//! [`check`] sends `INFO server` and reads `redis_version`, or `valkey_version` on Valkey
//! (which reports `redis_version:7.2.4` for compatibility next to `server_name:valkey` and
//! its own `valkey_version`). The scripts need Redis 6.2 (`ZMSCORE`, `ZRANGE ... BYSCORE`,
//! `XTRIM ... MINID`); every Valkey release (7.2 and later) has them. See
//! docs/server-versions.md.
//!
//! - On a cluster, `INFO` goes to every primary (the nodes delayq's commands go to) and
//!   every one must pass; the oldest is reported. Replicas are not asked.
//! - A server that refuses `INFO` (an ACL user without `+info`, or a renamed command) does
//!   not stop the connection: delayq logs one warning per process and goes on unchecked.
//!   An error that is not the server's answer (a timeout, a broken connection) fails the
//!   connect as any other Redis error does.
//! - An answer without a readable version (a proxy that rewrites `INFO`) is refused with
//!   [`Error::Reply`]: delayq does not run on a server it cannot identify.

use crate::engine::error::{Error, Result};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, ServerErrorKind, Value};
use std::sync::atomic::{AtomicBool, Ordering};

/// The oldest server delayq runs on.
pub const MIN_VERSION: (u32, u32, u32) = (6, 2, 0);

/// What `INFO server` says about one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInfo {
    /// `"redis"` or `"valkey"`.
    pub name: &'static str,
    /// Major, minor, patch.
    pub version: (u32, u32, u32),
}

impl std::fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        write!(f, "{} {a}.{b}.{c}", self.name)
    }
}

impl ServerInfo {
    /// Whether the server knows script flags (`#!lua flags=...`: Redis 7.0, every Valkey).
    pub fn has_script_flags(&self) -> bool {
        self.name == "valkey" || self.at_least((7, 0, 0))
    }

    /// Whether the server has sharded Pub/Sub (`SPUBLISH`, `SSUBSCRIBE`: Redis 7.0, every
    /// Valkey): wake-ups then go out on shard channels, else on plain ones (6.2).
    pub fn has_spublish(&self) -> bool {
        self.name == "valkey" || self.at_least((7, 0, 0))
    }

    /// Whether the server has `HGETDEL` (Redis 8.0, Valkey 9.0): the dispatcher then reads
    /// and deletes the payloads of a batch in one command instead of `HMGET` + `HDEL`.
    pub fn has_hgetdel(&self) -> bool {
        match self.name {
            "valkey" => self.at_least((9, 0, 0)),
            _ => self.at_least((8, 0, 0)),
        }
    }

    /// True when the server is at least `version` (as its own name counts versions).
    pub fn at_least(&self, version: (u32, u32, u32)) -> bool {
        self.version >= version
    }

    /// [`Error::UnsupportedServer`] when older than [`MIN_VERSION`]; `node` (a cluster
    /// node's address) is named in the message when given.
    fn require_supported(self, node: Option<&str>) -> Result<Self> {
        if self.at_least(MIN_VERSION) {
            return Ok(self);
        }
        let (a, b, c) = MIN_VERSION;
        Err(Error::UnsupportedServer {
            found: match node {
                Some(n) => format!("{self} (cluster node {n})"),
                None => self.to_string(),
            },
            required: format!("{a}.{b}.{c}"),
        })
    }
}

/// Set once the "INFO refused" warning was logged, so a process that connects many times
/// logs it once.
static INFO_REFUSED_WARNED: AtomicBool = AtomicBool::new(false);

/// Checks the server behind `conn` (every primary of a cluster) and returns what it is: the
/// oldest node of a cluster. `Ok(None)` when the server refuses `INFO` (see the module
/// docs); [`Error::UnsupportedServer`] when a server is older than [`MIN_VERSION`].
pub async fn check<C: ConnectionLike>(conn: &mut C) -> Result<Option<ServerInfo>> {
    const CONTEXT: &str = "checking the server version (INFO server)";
    let reply: Value = match redis::cmd("INFO").arg("server").query_async(conn).await {
        Ok(v) => v,
        Err(e) if refused(&e) => {
            if !INFO_REFUSED_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    error = %e,
                    "the server refused INFO: its version is not checked (delayq needs redis 6.2 or newer; grant +info to check it)"
                );
            }
            return Ok(None);
        }
        Err(source) => {
            return Err(Error::Redis {
                context: CONTEXT,
                source,
            });
        }
    };
    let text = |v: Value| {
        redis::from_redis_value::<String>(v).map_err(|e| Error::Reply {
            context: CONTEXT,
            detail: format!("INFO server did not answer text: {e}"),
        })
    };
    match reply {
        // A cluster: one answer per primary, by address.
        Value::Map(nodes) => {
            let mut oldest: Option<ServerInfo> = None;
            for (addr, answer) in nodes {
                let addr = redis::from_redis_value::<String>(addr).unwrap_or_default();
                let info = parse_fields(&text(answer)?).map_err(|detail| Error::Reply {
                    context: CONTEXT,
                    detail: format!("cluster node {addr}: {detail}"),
                })?;
                info.require_supported(Some(&addr))?;
                if oldest.is_none_or(|o| info.version < o.version) {
                    oldest = Some(info);
                }
            }
            oldest.map(Some).ok_or_else(|| Error::Reply {
                context: CONTEXT,
                detail: "no cluster node answered INFO".into(),
            })
        }
        one => parse_info(&text(one)?).map(Some),
    }
}

/// True for an error that is the server's answer to `INFO` itself (`NOPERM`, an unknown
/// command), as opposed to a connection that failed.
fn refused(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
    )
}

/// Reads the server's name and version from the text of `INFO server` and refuses one
/// older than [`MIN_VERSION`] ([`Error::UnsupportedServer`]); text without a readable
/// version is [`Error::Reply`].
pub fn parse_info(text: &str) -> Result<ServerInfo> {
    parse_fields(text)
        .map_err(|detail| Error::Reply {
            context: "checking the server version (INFO server)",
            detail,
        })?
        .require_supported(None)
}

/// The name and version in `INFO server`, without the minimum check.
fn parse_fields(text: &str) -> Result<ServerInfo, String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let (name, key) = if field("valkey_version").is_some() {
        ("valkey", "valkey_version")
    } else if field("server_name") == Some("valkey") {
        // A Valkey without valkey_version reports its own version as redis_version.
        ("valkey", "redis_version")
    } else {
        ("redis", "redis_version")
    };
    let raw = field(key).ok_or_else(|| {
        let start: String = text.chars().take(60).collect();
        format!("INFO server has no {key} field (the answer starts {start:?})")
    })?;
    let version =
        parse_version(raw).ok_or_else(|| format!("{key} {raw:?} is not a version (x.y.z)"))?;
    Ok(ServerInfo { name, version })
}

/// `"7.0.15"` → `(7, 0, 15)`; a missing patch is 0 and a suffix (`"8.2.3-rc1"`) is ignored.
fn parse_version(raw: &str) -> Option<(u32, u32, u32)> {
    let mut parts = raw.split('.');
    let mut next = |required: bool| -> Option<u32> {
        match parts.next() {
            Some(p) => {
                let digits: &str = &p[..p.find(|c: char| !c.is_ascii_digit()).unwrap_or(p.len())];
                digits.parse().ok()
            }
            None if required => None,
            None => Some(0),
        }
    };
    Some((next(true)?, next(true)?, next(false)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS_7: &str = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\nos:Linux 6.1.0 x86_64\r\n";
    const REDIS_8: &str = "# Server\r\nredis_version:8.2.3\r\nredis_git_sha1:b5d43ceb\r\nredis_git_dirty:0\r\nredis_mode:standalone\r\n";
    const VALKEY_9: &str = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\nvalkey_release_stage:ga\r\nserver_mode:standalone\r\n";
    const REDIS_6_0: &str = "# Server\r\nredis_version:6.0.16\r\nredis_mode:standalone\r\n";

    #[test]
    fn supported_servers() {
        let r7 = parse_info(REDIS_7).unwrap();
        assert_eq!(
            r7,
            ServerInfo {
                name: "redis",
                version: (7, 0, 15)
            }
        );
        assert_eq!(r7.to_string(), "redis 7.0.15");
        assert_eq!(parse_info(REDIS_8).unwrap().version, (8, 2, 3));
        let v = parse_info(VALKEY_9).unwrap();
        assert_eq!(
            v,
            ServerInfo {
                name: "valkey",
                version: (9, 1, 2)
            }
        );
        assert_eq!(v.to_string(), "valkey 9.1.2");
        // The minimum itself passes; a Valkey without valkey_version uses redis_version.
        assert_eq!(
            parse_info("redis_version:6.2.0\n").unwrap().version,
            (6, 2, 0)
        );
        assert_eq!(
            parse_info("redis_version:7.2.4\nserver_name:valkey\n").unwrap(),
            ServerInfo {
                name: "valkey",
                version: (7, 2, 4)
            }
        );
        // Suffixes and a missing patch are tolerated.
        assert_eq!(
            parse_info("redis_version:8.2.3-rc1\n").unwrap().version,
            (8, 2, 3)
        );
        assert_eq!(
            parse_info("redis_version:7.4\n").unwrap().version,
            (7, 4, 0)
        );
    }

    #[test]
    fn too_old_is_refused_naming_both_versions() {
        let e = parse_info(REDIS_6_0).unwrap_err();
        match &e {
            Error::UnsupportedServer { found, required } => {
                assert_eq!(found, "redis 6.0.16");
                assert_eq!(required, "6.2.0");
            }
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("6.0.16") && msg.contains("6.2.0"), "{msg}");
        // 6.1.x were the 6.2 release candidates: refused too.
        assert!(matches!(
            parse_info("redis_version:6.1.240\n"),
            Err(Error::UnsupportedServer { .. })
        ));
        // A cluster node is named.
        let e = parse_fields(REDIS_6_0)
            .unwrap()
            .require_supported(Some("10.0.0.7:6379"))
            .unwrap_err();
        assert!(e.to_string().contains("10.0.0.7:6379"), "{e}");
    }

    #[test]
    fn garbage_is_a_clear_error() {
        for text in [
            "",
            "hello world",
            "# Server\r\nredis_mode:standalone\r\n",
            "redis_version:\r\n",
            "redis_version:seven\r\n",
            "redis_version:7\r\n",
            "redis_version_x:7.0.0\r\n",
            "\u{0}\u{ff}:::",
        ] {
            match parse_info(text) {
                Err(Error::Reply { detail, .. }) => {
                    assert!(detail.contains("redis_version"), "{text:?}: {detail}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        match parse_info("server_name:valkey\nvalkey_version:nine\n") {
            Err(Error::Reply { detail, .. }) => assert!(detail.contains("valkey_version")),
            other => panic!("{other:?}"),
        }
    }

    /// A connection that answers every command with `reply` (RESP bytes).
    struct Canned(&'static [u8]);

    impl ConnectionLike for Canned {
        fn req_packed_command<'a>(
            &'a mut self,
            _cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            let v = redis::parse_redis_value(self.0);
            Box::pin(async move { v })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _pipeline: &'a redis::Pipeline,
            _offset: usize,
            _count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async { Ok(vec![]) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn one_server_and_a_cluster() {
        // One server: the text (RESP2 bulk string).
        let one = b"$41\r\n# Server\r\nredis_version:7.0.15\r\nfoo:bar\r\n\r\n";
        assert_eq!(
            run(check(&mut Canned(one))).unwrap().unwrap().to_string(),
            "redis 7.0.15"
        );
        // A cluster: a map of node address to text, as the cluster client aggregates it;
        // the oldest node is reported.
        let cluster = b"%2\r\n$14\r\n127.0.0.1:7000\r\n$21\r\nredis_version:8.2.3\r\n\r\n$14\r\n127.0.0.1:7001\r\n$22\r\nredis_version:7.0.15\r\n\r\n";
        assert_eq!(
            run(check(&mut Canned(cluster)))
                .unwrap()
                .unwrap()
                .to_string(),
            "redis 7.0.15"
        );
        // One old node refuses the whole cluster, naming it.
        let mixed = b"%2\r\n$14\r\n127.0.0.1:7000\r\n$21\r\nredis_version:8.2.3\r\n\r\n$14\r\n127.0.0.1:7001\r\n$22\r\nredis_version:6.0.16\r\n\r\n";
        let e = run(check(&mut Canned(mixed))).unwrap_err();
        assert!(matches!(e, Error::UnsupportedServer { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("6.0.16") && msg.contains("6.2.0") && msg.contains("127.0.0.1:7001"),
            "{msg}"
        );
        // A node without a version is a clear error naming the node.
        let odd = b"%1\r\n$14\r\n127.0.0.1:7002\r\n$5\r\nhello\r\n";
        let e = run(check(&mut Canned(odd))).unwrap_err().to_string();
        assert!(
            e.contains("127.0.0.1:7002") && e.contains("redis_version"),
            "{e}"
        );
    }

    #[test]
    fn a_server_refusing_info_does_not_block_connecting() {
        let noperm = b"-NOPERM User app has no permissions to run the 'info' command\r\n";
        assert_eq!(run(check(&mut Canned(noperm))).unwrap(), None);
        let unknown = b"-ERR unknown command 'INFO', with args beginning with: 'server' \r\n";
        assert_eq!(run(check(&mut Canned(unknown))).unwrap(), None);
        // In a cluster the node's refusal is inside the map.
        let cluster = b"%1\r\n$14\r\n127.0.0.1:7000\r\n-NOPERM no permissions\r\n";
        assert_eq!(run(check(&mut Canned(cluster))).unwrap(), None);
        // Other errors are not a refusal.
        let loading = b"-LOADING Redis is loading the dataset in memory\r\n";
        assert!(matches!(
            run(check(&mut Canned(loading))),
            Err(Error::Redis { .. })
        ));
    }

    /// On the server the tests run (`redis-server`, or `$DELAYQ_TEST_REDIS_SERVER`): the
    /// version found is the one `--version` prints, and a user without `+info` connects.
    #[cfg(feature = "test-util")]
    #[tokio::test]
    async fn live_server() {
        use crate::testing::local_redis::{LocalRedis, server_binary};
        use std::time::Duration;
        let bin = server_binary();
        let server = LocalRedis::start().unwrap();
        // "Redis server v=7.0.15 sha=..." / "Valkey server v=9.1.2 sha=...".
        let out = std::process::Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        let expected = format!(
            "{} {}",
            printed.split_whitespace().next().unwrap().to_lowercase(),
            printed
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .unwrap()
        );
        let connect = |url: String| async move {
            crate::engine::conn::RedisTarget::open(&url)
                .unwrap()
                .connect(Duration::from_secs(2), Duration::from_secs(2))
                .await
                .unwrap()
        };
        let mut conn = connect(server.url()).await;
        let info = check(&mut conn).await.unwrap().unwrap();
        assert_eq!(info.to_string(), expected, "{bin}: {printed}");

        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("noinfo")
            .arg(["on", ">pw", "~*", "&*", "+@all", "-info"].as_slice())
            .query_async(&mut conn)
            .await
            .unwrap();
        let url = format!("redis://noinfo:pw@127.0.0.1:{}", server.port());
        assert_eq!(check(&mut connect(url.clone()).await).await.unwrap(), None);
        crate::Client::connect(&url).await.unwrap();
    }
}
