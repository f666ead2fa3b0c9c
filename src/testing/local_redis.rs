//! A throwaway `redis-server` on a free port in a temporary directory, killed on drop.
//!
//! Used by the zero-configuration demo and example when no Redis is reachable, and by the
//! test suite (every test starts its own servers; none touches a shared Redis).
//!
//! The server binary is `redis-server` on `PATH`, or the one named by the environment
//! variable [`SERVER_ENV`] (`DELAYQ_TEST_REDIS_SERVER`, a path or a command name), so the
//! same tests run on another Redis or on Valkey (`.ci/matrix.sh`, docs/server-versions.md).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway `redis-server` could not be started, signalled or given a port: the test
/// utilities' own error (the engine's [`Error`](crate::Error) knows nothing of them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not start a local redis-server: {0}")]
pub struct LocalRedisError(pub String);

/// The environment variable naming the server binary to start instead of `redis-server`.
pub const SERVER_ENV: &str = "DELAYQ_TEST_REDIS_SERVER";

/// The server binary [`LocalRedis`] starts: `$DELAYQ_TEST_REDIS_SERVER` when set and not
/// empty, else `redis-server`.
pub fn server_binary() -> String {
    std::env::var(SERVER_ENV)
        .ok()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// A `redis-server` process of our own.
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
    /// The binary started ([`server_binary`] at start).
    binary: String,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

/// True when a Redis at `url` (or, for a `redis+cluster://` URL, one of its seed nodes)
/// answers PING within half a second.
pub fn reachable(url: &str) -> bool {
    let ping = |u: &str| {
        redis::Client::open(u)
            .and_then(|c| {
                let mut conn = c.get_connection_with_timeout(Duration::from_millis(500))?;
                redis::cmd("PING").query::<String>(&mut conn)
            })
            .is_ok()
    };
    match crate::engine::conn::RedisTarget::open(url) {
        // A cluster is reachable when one of its seed nodes answers.
        Ok(crate::engine::conn::RedisTarget::Cluster(nodes)) => nodes.iter().any(|n| ping(n)),
        _ => ping(url),
    }
}

impl LocalRedis {
    /// Starts `redis-server` (or [`server_binary`]) with no persistence on a free port.
    pub fn start() -> Result<Self, LocalRedisError> {
        Self::start_with(&[])
    }

    /// Starts `redis-server` (or [`server_binary`]) with extra arguments (e.g.
    /// `["--appendonly", "yes"]`).
    pub fn start_with(extra_args: &[&str]) -> Result<Self, LocalRedisError> {
        let binary = server_binary();
        let mut dir = tempfile::Builder::new()
            .prefix("delayq-redis-")
            .tempdir()
            .map_err(|e| LocalRedisError(format!("cannot create a temp dir: {e}")))?;
        let mut last_err = String::new();
        // A port found free can be taken before redis binds it: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let mut r = LocalRedis {
                child: None,
                binary: binary.clone(),
                port,
                dir,
                extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
            };
            match r.spawn_and_wait() {
                Ok(()) => return Ok(r),
                Err(e) => {
                    last_err = e.to_string();
                    r.kill();
                    dir = std::mem::replace(
                        &mut r.dir,
                        tempfile::tempdir().map_err(|e| LocalRedisError(e.to_string()))?,
                    );
                }
            }
        }
        Err(LocalRedisError(last_err))
    }

    fn spawn_and_wait(&mut self) -> Result<(), LocalRedisError> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path());
        cmd.args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            let bin = &self.binary;
            if e.kind() != std::io::ErrorKind::NotFound {
                LocalRedisError(format!("cannot run {bin}: {e}"))
            } else if std::env::var_os(SERVER_ENV).is_some_and(|v| !v.is_empty()) {
                LocalRedisError(format!("{bin} (named by {SERVER_ENV}) was not found"))
            } else {
                LocalRedisError(format!(
                    "{bin} is not installed (e.g. `apt-get install redis-server`, or name another server binary in {SERVER_ENV})"
                ))
            }
        })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    /// Waits until the server answers PING (after a start or restart).
    fn wait_ready(&mut self, within: Duration) -> Result<(), LocalRedisError> {
        let deadline = Instant::now() + within;
        let url = self.url();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(LocalRedisError(format!(
                    "{} exited with {status}; log:\n{}",
                    self.binary,
                    self.log()
                )));
            }
            let ping = redis::Client::open(url.as_str()).and_then(|c| {
                let mut conn = c.get_connection_with_timeout(Duration::from_millis(200))?;
                redis::cmd("PING").query::<String>(&mut conn)
            });
            if ping.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LocalRedisError(format!(
                    "{} did not answer within {within:?}; log:\n{}",
                    self.binary,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (AOF and RDB files live here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server binary this instance runs.
    pub fn binary(&self) -> &str {
        &self.binary
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills the server with SIGKILL (a crash) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the server (SIGSTOP): it keeps its connections but answers nothing, as a
    /// machine that hangs. [`resume`](Self::resume) thaws it.
    pub fn suspend(&self) -> Result<(), LocalRedisError> {
        self.signal("-STOP")
    }

    /// Thaws a server frozen by [`suspend`](Self::suspend) (SIGCONT).
    pub fn resume(&self) -> Result<(), LocalRedisError> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> Result<(), LocalRedisError> {
        let pid = self
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| LocalRedisError("the server is not running".into()))?;
        let status = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .map_err(|e| LocalRedisError(format!("kill {sig}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(LocalRedisError(format!("kill {sig} {pid}: {status}")))
        }
    }

    /// Starts the server again on the same port and directory (after [`kill`](Self::kill)).
    pub fn restart(&mut self) -> Result<(), LocalRedisError> {
        self.kill();
        self.spawn_and_wait()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- log of {} on port {} ---\n{}",
                self.binary,
                self.port,
                self.log()
            );
        }
        self.kill();
    }
}

/// A port that was free a moment ago, and that this process has not been given before: two
/// servers started together (a master and its sentinels, say) never get the same one. (The
/// operating system may hand a released port out again at once; another process may still
/// take it, which [`LocalRedis::start`] survives by trying again.)
pub fn free_port() -> Result<u16, LocalRedisError> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| LocalRedisError(format!("no free port: {e}")))?;
        let port = l
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| LocalRedisError(format!("no free port: {e}")))?;
        let fresh = GIVEN
            .lock()
            .map_err(|_| LocalRedisError("the port registry is poisoned".into()))?
            .insert(port);
        if fresh {
            return Ok(port);
        }
    }
}
