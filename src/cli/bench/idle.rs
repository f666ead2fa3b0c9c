//! `idle` with `--processes P` ≥ 1: `--queues` queues of `--shards` shards declared and
//! nothing due, while P real `delayq serve` processes (this binary, `serve --config` with
//! the defaults: every queue dispatched, the maintenance services on) run against the
//! bench's namespace: Redis commands per second and Redis CPU per second of wall time over
//! `--window`, after each serve answers on its HTTP port and a settle of [`SETTLE`].

use super::*;
use std::process::Stdio;

/// Wait after every serve answers, before measuring (start-up work done).
const SETTLE: Duration = Duration::from_secs(2);
/// Longest wait for a serve to answer on its HTTP port.
const STARTUP: Duration = Duration::from_secs(60);

/// The serve children; each is asked to stop (SIGTERM) and awaited on drop of the run,
/// killed if it does not exit.
struct Serves {
    children: Vec<tokio::process::Child>,
    _dir: tempfile::TempDir,
}

impl Serves {
    async fn start(client: &Client, url: &str, count: usize) -> anyhow::Result<(Self, Vec<u16>)> {
        let dir = tempfile::tempdir()?;
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for p in 0..count {
            let port = crate::testing::local_redis::free_port()?;
            let cfg = dir.path().join(format!("serve-{p}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "redis_url = {}\nnamespace = {}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
                    toml_string(url),
                    toml_string(client.keyspace().namespace()),
                ),
            )?;
            let log = std::fs::File::create(dir.path().join(format!("serve-{p}.log")))?;
            let child = tokio::process::Command::new(std::env::current_exe()?)
                .arg("serve")
                .arg("--config")
                .arg(&cfg)
                .env_remove("DELAYQ_REDIS_URL")
                .env_remove("DELAYQ_NAMESPACE")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()?;
            children.push(child);
            ports.push(port);
        }
        Ok((
            Serves {
                children,
                _dir: dir,
            },
            ports,
        ))
    }

    /// Waits until every serve accepts connections on its HTTP port (or one exits).
    async fn wait_ready(&mut self, ports: &[u16]) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP;
        for (child, port) in self.children.iter_mut().zip(ports) {
            loop {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("a delayq serve exited at start-up ({status})");
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", *port))
                    .await
                    .is_ok()
                {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "a delayq serve did not listen on port {port} within {STARTUP:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// SIGTERM to each, then waits for them (killed after 10 s).
    async fn stop(mut self) -> anyhow::Result<()> {
        for child in &self.children {
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status()
                    .await;
            }
        }
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                child.kill().await?;
            }
        }
        Ok(())
    }
}

/// Waits until every serve's listener holds the wake channel of every shard (start-up over
/// many queues takes a while; until then dispatchers poll fast), at most [`STARTUP`].
async fn wait_subscribed(client: &Client, opts: &BenchOptions) -> anyhow::Result<()> {
    let mut channels = Vec::new();
    // The queues this scenario declared (the bench's own queue is left out).
    for i in 0..opts.queues.saturating_sub(1) {
        let q = crate::engine::keys::QueueName::new(&format!("idle-{i}"))?;
        for k in client.keyspace().shards(&q, opts.shards) {
            channels.push(k.wake_channel());
        }
    }
    let want = channels.len() * opts.processes;
    let sharded = client.server().is_none_or(|s| s.has_spublish());
    let deadline = Instant::now() + STARTUP;
    loop {
        let mut have = 0;
        for chunk in channels.chunks(1000) {
            let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
                .arg(if sharded { "SHARDNUMSUB" } else { "NUMSUB" })
                .arg(chunk)
                .query_async(&mut client.connection())
                .await?;
            have += counts.iter().map(|(_, n)| n).sum::<usize>();
        }
        if have >= want {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the serves hold {have} of {want} wake subscriptions after {STARTUP:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

pub(super) async fn idle(
    client: &Client,
    url: &str,
    opts: &BenchOptions,
) -> anyhow::Result<BenchReport> {
    for i in 0..opts.queues.saturating_sub(1) {
        client
            .admin()
            .create_queue(&format!("idle-{i}"), opts.shards)
            .await?;
    }
    let (mut serves, ports) = Serves::start(client, url, opts.processes).await?;
    let measured = async {
        serves.wait_ready(&ports).await?;
        wait_subscribed(client, opts).await?;
        tokio::time::sleep(SETTLE).await;
        let cmds0: f64 = info_field(client, "stats", "total_commands_processed").await?;
        let cpu0 = redis_cpu_s(client).await?;
        let stats0 = command_stats(client).await?;
        let started = Instant::now();
        tokio::time::sleep(opts.window).await;
        let cmds1: f64 = info_field(client, "stats", "total_commands_processed").await?;
        let cpu1 = redis_cpu_s(client).await?;
        let stats1 = command_stats(client).await?;
        let took = started.elapsed().as_secs_f64();
        anyhow::Ok((cmds1 - cmds0, cpu1 - cpu0, stats0, stats1, took))
    }
    .await;
    serves.stop().await?;
    let (cmds, cpu, stats0, stats1, took) = measured?;
    let scripts = measure::stat_delta(&stats0, &stats1, "evalsha").0
        + measure::stat_delta(&stats0, &stats1, "evalsha_ro").0;
    // The busiest commands, per second.
    let mut busiest: Vec<(String, f64)> = stats1
        .keys()
        .map(|k| (k.clone(), measure::stat_delta(&stats0, &stats1, k).0 / took))
        .filter(|(_, per_s)| *per_s > 0.0)
        .collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    let busiest = busiest
        .iter()
        .take(5)
        .map(|(k, per_s)| format!("{k} {per_s:.0}/s"))
        .collect::<Vec<_>>()
        .join(", ");
    // The measurement's own INFO calls (three before, two after the first reading) are
    // taken out.
    let cmds = cmds - 3.0;
    Ok(BenchReport {
        scenario: "idle".into(),
        n: opts.queues,
        commands_per_s: Some(cmds / took),
        redis_cpu_ms_per_s: Some(cpu * 1e3 / took),
        notes: format!(
            "{} queue(s) x {} shard(s) x {} delayq serve process(es) (default settings), \
             nothing due, over {took:.1} s: {:.0} script calls/s, Redis CPU {:.2}% of one core; \
             busiest: {busiest}",
            opts.queues,
            opts.shards,
            opts.processes,
            scripts / took,
            cpu * 100.0 / took
        ),
        ..Default::default()
    })
}
