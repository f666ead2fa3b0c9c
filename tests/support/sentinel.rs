//! Redis Sentinel set-ups of the tests' own (tests/service/production.rs, the fault
//! campaign's `sentinel` class): `redis-server` processes from a config file in a temp dir
//! ([`Proc`]), a master with replicas and three sentinels ([`sentinel_group_n`]), and the
//! probes that await them.

use crate::support::serve::free_port;
use crate::support::wait_for;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a set-up step may take.
pub const WAIT: Duration = Duration::from_secs(30);

/// A `redis-server` (or sentinel) of the test's own, from a config file in a temp dir;
/// SIGKILLed on drop, its log printed when the test panics.
pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Proc {
    /// Starts `redis-server <conf> [--sentinel]`; `lines` are added to a config naming
    /// the dir and the log (and `port` unless they name one).
    pub fn start(name: &str, port: u16, lines: &[String], sentinel: bool) -> Proc {
        let dir = tempfile::Builder::new()
            .prefix("delayq-prod-")
            .tempdir()
            .unwrap();
        let mut conf = format!(
            "bind 127.0.0.1\ndir {d}\nlogfile {d}/server.log\n",
            d = dir.path().display()
        );
        if !lines.iter().any(|l| l.starts_with("port ")) {
            conf.push_str(&format!("port {port}\n"));
        }
        for l in lines {
            conf.push_str(l);
            conf.push('\n');
        }
        let path = dir.path().join("server.conf");
        std::fs::write(&path, conf).unwrap();
        // The server LocalRedis starts ($DELAYQ_TEST_REDIS_SERVER, else redis-server).
        let binary = std::env::var("DELAYQ_TEST_REDIS_SERVER")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        let mut cmd = Command::new(binary);
        cmd.arg(&path);
        if sentinel {
            cmd.arg("--sentinel");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Proc {
            name: name.to_owned(),
            child: Some(child),
            dir,
            port,
        }
    }

    /// A data server without persistence (and a replica of `master`, if given).
    pub fn data(name: &str, master: Option<u16>) -> Proc {
        Proc::data_with(name, master, &[])
    }

    /// [`Proc::data`] with more config lines (e.g. `min-replicas-to-write 1`).
    pub fn data_with(name: &str, master: Option<u16>, extra: &[String]) -> Proc {
        let mut lines = vec![
            "save \"\"".to_owned(),
            "appendonly no".to_owned(),
            "repl-diskless-sync-delay 0".to_owned(),
        ];
        if let Some(m) = master {
            lines.push(format!("replicaof 127.0.0.1 {m}"));
        }
        lines.extend(extra.iter().cloned());
        Proc::start(name, free_port(), &lines, false)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Fails the test (with the log) when the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!("{} exited with {status}:\n{}", self.name, self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- log of {} (port {}) ---\n{}",
                self.name,
                self.port,
                self.log()
            );
        }
        self.kill();
    }
}

/// A command on a plain connection to `url`.
pub async fn raw<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut c).await
}

pub const MASTER: &str = "mymaster";

pub fn sentinel(master_port: u16) -> Proc {
    let lines = [
        "sentinel resolve-hostnames no".to_owned(),
        format!("sentinel monitor {MASTER} 127.0.0.1 {master_port} 2"),
        format!("sentinel down-after-milliseconds {MASTER} 1000"),
        format!("sentinel failover-timeout {MASTER} 10000"),
        format!("sentinel parallel-syncs {MASTER} 1"),
    ];
    Proc::start("sentinel", free_port(), &lines, true)
}

/// The master's port according to the sentinel at `url`.
pub async fn master_port(url: &str) -> Option<u16> {
    let addr: Option<(String, u16)> = raw(url, &["SENTINEL", "get-master-addr-by-name", MASTER])
        .await
        .ok()?;
    addr.map(|(_, p)| p)
}

/// True when the replica at `url` is connected to its master and in sync.
pub async fn replica_in_sync(url: &str) -> bool {
    let info: String = raw(url, &["INFO", "replication"]).await.unwrap_or_default();
    info.contains("role:slave") && info.contains("master_link_status:up")
}

/// True when every sentinel lists the server on `port` as a replica that is not down.
pub async fn sentinels_see_replica(sentinels: &[String], port: u16) -> bool {
    for s in sentinels {
        let replicas: Vec<std::collections::HashMap<String, String>> =
            match raw(s, &["SENTINEL", "replicas", MASTER]).await {
                Ok(r) => r,
                Err(_) => return false,
            };
        let seen = replicas.iter().any(|r| {
            r.get("port").map(String::as_str) == Some(port.to_string().as_str())
                && r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        });
        if !seen {
            return false;
        }
    }
    true
}

/// A master, its replica in sync, and three sentinels that all see both; the sentinel URL.
pub async fn sentinel_group() -> (Proc, Proc, Vec<Proc>, String) {
    sentinel_group_with(&[]).await
}

/// [`sentinel_group`] with more config lines for both data servers.
pub async fn sentinel_group_with(extra: &[String]) -> (Proc, Proc, Vec<Proc>, String) {
    let (master, mut replicas, sentinels, url) = sentinel_group_n(extra, 1).await;
    let replica = replicas.pop().expect("one replica");
    (master, replica, sentinels, url)
}

/// A master, `replicas` replicas in sync, and three sentinels that all see them; the
/// sentinel URL. `extra` config lines go to every data server.
pub async fn sentinel_group_n(
    extra: &[String],
    replicas: usize,
) -> (Proc, Vec<Proc>, Vec<Proc>, String) {
    let master = Proc::data_with("master", None, extra);
    let mut reps = Vec::new();
    for i in 0..replicas {
        let r = Proc::data_with(&format!("replica{i}"), Some(master.port), extra);
        let r_url = r.url();
        wait_for("the replica in sync", WAIT, || replica_in_sync(&r_url)).await;
        reps.push(r);
    }
    let sentinels: Vec<Proc> = (0..3).map(|_| sentinel(master.port)).collect();
    for s in &sentinels {
        let u = s.url();
        wait_for(
            "each sentinel knows the replicas and the others",
            WAIT,
            move || {
                let u = u.clone();
                async move {
                    let known: redis::RedisResult<Vec<redis::Value>> =
                        raw(&u, &["SENTINEL", "replicas", MASTER]).await;
                    let others: redis::RedisResult<Vec<redis::Value>> =
                        raw(&u, &["SENTINEL", "sentinels", MASTER]).await;
                    matches!((known, others), (Ok(r), Ok(s)) if r.len() == replicas && s.len() == 2)
                }
            },
        )
        .await;
    }
    let url = sentinel_url(&sentinels);
    (master, reps, sentinels, url)
}

/// `redis+sentinel://` naming every sentinel of `sentinels` and [`MASTER`].
pub fn sentinel_url(sentinels: &[Proc]) -> String {
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
}
