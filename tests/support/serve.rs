//! `delayq serve` as a real process for tests: a config in a temp dir, the log captured, its
//! HTTP port waited for, SIGTERM and the exit awaited.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `delayq` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_delayq");

/// A free TCP port on 127.0.0.1.
/// A free port this test process has not been given before (`LocalRedis`'s, so no two
/// servers of one run share one).
pub fn free_port() -> u16 {
    delayq::testing::local_redis::free_port().unwrap()
}

/// A running `delayq serve`.
pub struct Serve {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Serve {
    /// Writes `config` (the text may use `{port}` for the HTTP port) and starts `serve`,
    /// through `sh -c "<prefix> exec delayq serve ..."` when a shell prefix is given (e.g.
    /// `ulimit -S -n 1024;`).
    pub fn start(config: &str, shell_prefix: Option<&str>) -> Serve {
        Self::start_with_env(config, shell_prefix, &[])
    }

    /// [`start`](Self::start) with extra environment variables.
    pub fn start_with_env(
        config: &str,
        shell_prefix: Option<&str>,
        envs: &[(&str, &str)],
    ) -> Serve {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("delayq.toml");
        std::fs::write(&cfg, config.replace("{port}", &port.to_string())).unwrap();
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let mut cmd = match shell_prefix {
            Some(prefix) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!(
                    "{prefix} exec {BIN} serve --config {}",
                    cfg.display()
                ));
                c
            }
            None => {
                let mut c = Command::new(BIN);
                c.args(["serve", "--config", cfg.to_str().unwrap()]);
                c
            }
        };
        let child = cmd
            .env_remove("DELAYQ_REDIS_URL")
            .env_remove("DELAYQ_NAMESPACE")
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Serve { child, dir, port }
    }

    /// [`start`](Self::start) with environment variables set (`Some`) or removed (`None`)
    /// after the defaults, so `("RUST_LOG", None)` runs at the default log level.
    pub fn start_with_vars(config: &str, vars: &[(&str, Option<&str>)]) -> Serve {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("delayq.toml");
        std::fs::write(&cfg, config.replace("{port}", &port.to_string())).unwrap();
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--config", cfg.to_str().unwrap()])
            .env_remove("DELAYQ_REDIS_URL")
            .env_remove("DELAYQ_NAMESPACE")
            .env("RUST_LOG", "info");
        for (k, v) in vars {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap();
        Serve { child, dir, port }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("serve.log")
    }

    /// Waits until `/readyz` answers 200: connected to Redis and serving the API (panics
    /// with the log after `within`).
    pub async fn wait_ready(&mut self, within: Duration) {
        let port = self.port;
        let ready = super::poll(within, || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("serve exited with {status}:\n{}", self.log());
            }
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()?;
                let _ = s
                    .write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    .await;
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
                buf.starts_with(b"HTTP/1.1 200").then_some(())
            }
        })
        .await;
        if ready.is_none() {
            panic!("serve did not answer within {within:?}:\n{}", self.log());
        }
    }

    /// Waits until `/healthz` answers 200: the process is up (it may still be waiting for
    /// Redis; panics with the log after `within`).
    pub async fn wait_alive(&mut self, within: Duration) {
        let port = self.port;
        let ready = super::poll(within, || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("serve exited with {status}:\n{}", self.log());
            }
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()?;
                let _ = s
                    .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    .await;
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
                buf.starts_with(b"HTTP/1.1 200").then_some(())
            }
        })
        .await;
        if ready.is_none() {
            panic!("serve did not answer within {within:?}:\n{}", self.log());
        }
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
    }

    /// Waits for the process to exit; its exit code, or `None` if it is still running after
    /// `within` (then it is killed).
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let code = super::poll(within, || {
            let code = self
                .child
                .try_wait()
                .ok()
                .flatten()
                .map(|s| s.code().unwrap_or(-1));
            async move { code }
        })
        .await;
        if code.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        code
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- serve log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
