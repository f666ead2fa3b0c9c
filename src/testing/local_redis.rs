//! A throwaway `redis-server` on a free port in a temporary directory, killed on drop.
//!
//! Used by the zero-configuration demo and example when no Redis is reachable, and by the
//! test suite (every test starts its own servers; none touches a shared Redis).

use crate::error::{Error, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` process of our own.
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
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
    /// Starts `redis-server` with no persistence on a free port.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Starts `redis-server` with extra arguments (e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra_args: &[&str]) -> Result<Self> {
        let mut dir = tempfile::Builder::new()
            .prefix("delayq-redis-")
            .tempdir()
            .map_err(|e| Error::LocalRedis(format!("cannot create a temp dir: {e}")))?;
        let mut last_err = String::new();
        // A port found free can be taken before redis binds it: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let mut r = LocalRedis {
                child: None,
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
                        tempfile::tempdir().map_err(|e| Error::LocalRedis(e.to_string()))?,
                    );
                }
            }
        }
        Err(Error::LocalRedis(last_err))
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let mut cmd = Command::new("redis-server");
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
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::LocalRedis(
                    "redis-server is not installed (e.g. `apt-get install redis-server`)".into(),
                )
            } else {
                Error::LocalRedis(format!("cannot run redis-server: {e}"))
            }
        })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    /// Waits until the server answers PING (after a start or restart).
    fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let url = self.url();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(Error::LocalRedis(format!(
                    "redis-server exited with {status}; log:\n{}",
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
                return Err(Error::LocalRedis(format!(
                    "redis-server did not answer within {within:?}; log:\n{}",
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
    pub fn suspend(&self) -> Result<()> {
        self.signal("-STOP")
    }

    /// Thaws a server frozen by [`suspend`](Self::suspend) (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| Error::LocalRedis("the server is not running".into()))?;
        let status = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .map_err(|e| Error::LocalRedis(format!("kill {sig}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::LocalRedis(format!("kill {sig} {pid}: {status}")))
        }
    }

    /// Starts the server again on the same port and directory (after [`kill`](Self::kill)).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn_and_wait()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- log of redis-server on port {} ---\n{}",
                self.port,
                self.log()
            );
        }
        self.kill();
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::LocalRedis(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::LocalRedis(format!("no free port: {e}")))
}
