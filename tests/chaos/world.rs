//! The campaign's world: one Redis with AOF, two `delayq serve` processes, a webhook
//! receiver and a library worker in this process, the fault injector, and the run from
//! start to the checked report.

use crate::history::{Answer, Delivery, History, mix, now_ms};
use crate::support::sentinel::{self, Proc};
use crate::support::serve::Serve;
use delayq::{Backoff, Client, LocalRedis, Worker, WorkerOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The queue every fault class but the delete race uses (groups `hook` and `lib`).
pub const QUEUE: &str = "chaos";
/// The queue that is force-deleted and re-created while it is used (group `hook`).
pub const EPH: &str = "eph";
/// The webhook handlers' group (both queues, both serves).
pub const HOOK: &str = "hook";
/// The library worker's group (on [`QUEUE`]).
pub const LIB: &str = "lib";
/// The handlers' timeout: a receiver that "hangs" answers only after it.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(2);
/// Entries one consumer may hold at once (concurrency + prefetch, both handlers): what a
/// killed process can leave delivered but unacknowledged, per queue it consumes.
pub const HELD_PER_CONSUMER: usize = 8 + 24;
/// Every wait of the campaign is bounded by this (generous: a loaded 2-core machine).
pub const WAIT: Duration = Duration::from_secs(120);

/// A class of fault (`DELAYQ_CHAOS_FAULTS`, comma separated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// SIGKILL of a serve, then a new one.
    ServeKill,
    /// SIGTERM of a serve (awaited), then a new one.
    ServeTerm,
    /// SIGKILL of Redis (AOF on), restarted on the same port and directory.
    RedisKill,
    /// SIGSTOP of Redis for 0.2-2 s, then SIGCONT.
    RedisStop,
    /// The webhook receiver answers 500 or hangs past the timeout, the library handler
    /// fails, by the seeded RNG.
    Receiver,
    /// [`EPH`] is force-deleted and re-created while orders are scheduled into it.
    QueueDelete,
    /// Recurring schedules are declared, changed and removed while they tick.
    Schedules,
    /// Redis is a Sentinel-managed master with two replicas (AOF `always`,
    /// `min-replicas-to-write 1`), reached through `redis+sentinel://`; the faults are
    /// `SENTINEL FAILOVER` and SIGKILL of the current master (then a replacement replica).
    /// `redis-kill` and `redis-stop` then act on the current master.
    Sentinel,
}

impl FaultClass {
    pub const ALL: [FaultClass; 8] = [
        FaultClass::ServeKill,
        FaultClass::ServeTerm,
        FaultClass::RedisKill,
        FaultClass::RedisStop,
        FaultClass::Receiver,
        FaultClass::QueueDelete,
        FaultClass::Schedules,
        FaultClass::Sentinel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultClass::ServeKill => "serve-kill",
            FaultClass::ServeTerm => "serve-term",
            FaultClass::RedisKill => "redis-kill",
            FaultClass::RedisStop => "redis-stop",
            FaultClass::Receiver => "receiver",
            FaultClass::QueueDelete => "queue-delete",
            FaultClass::Schedules => "schedules",
            FaultClass::Sentinel => "sentinel",
        }
    }

    /// `all`, or names separated by commas.
    pub fn parse_list(text: &str) -> Result<Vec<FaultClass>, String> {
        if text.trim() == "all" {
            return Ok(Self::ALL.to_vec());
        }
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                Self::ALL
                    .into_iter()
                    .find(|f| f.name() == s)
                    .ok_or_else(|| {
                        let names: Vec<_> = Self::ALL.iter().map(|f| f.name()).collect();
                        format!(
                            "unknown fault class {s:?}; known: all, {}",
                            names.join(", ")
                        )
                    })
            })
            .collect()
    }

    /// What `cargo test` runs: every class but [`FaultClass::Sentinel`] (opt-in: its world
    /// is slower to set up; docs/fault-campaign.md). A class whose violations come from a
    /// known defect being fixed may be left out here for a while (docs/fault-campaign.md,
    /// "Known defects").
    pub fn ci_default() -> Vec<FaultClass> {
        Self::ALL
            .into_iter()
            .filter(|f| *f != FaultClass::Sentinel)
            .collect()
    }
}

/// `90s`, `2m`, `1h` or plain seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (n, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// One campaign's settings.
#[derive(Debug, Clone)]
pub struct Campaign {
    pub seed: u64,
    pub duration: Duration,
    pub faults: Vec<FaultClass>,
}

impl Campaign {
    pub fn has(&self, f: FaultClass) -> bool {
        self.faults.contains(&f)
    }

    /// The command that runs this campaign again.
    pub fn reproduce(&self) -> String {
        let names: Vec<_> = self.faults.iter().map(|f| f.name()).collect();
        let sentinel = if self.has(FaultClass::Sentinel) {
            let replicas = std::env::var("DELAYQ_CHAOS_REPLICAS").unwrap_or_else(|_| "2".into());
            format!(
                "DELAYQ_CHAOS_REPLICAS={} DELAYQ_CHAOS_DURABILITY={} ",
                replicas.trim(),
                sentinel_durability()
            )
        } else {
            String::new()
        };
        format!(
            "DELAYQ_CHAOS_SEED={} DELAYQ_CHAOS_DURATION={}s DELAYQ_CHAOS_FAULTS={} {sentinel}cargo test --locked --test chaos -- --nocapture",
            self.seed,
            self.duration.as_secs(),
            names.join(",")
        )
    }
}

/// What a campaign found.
pub struct Report {
    pub summary: String,
    pub violations: Vec<String>,
}

/// Everything the tasks share.
pub struct World {
    pub cfg: Campaign,
    pub hist: History,
    /// The Redis processes. Only the fault task (and the healing phase after it) locks
    /// this, and it holds the lock for a whole fault, process signals and Sentinel calls
    /// included: one fault at a time owns the processes. No operation driver takes it; they
    /// reach Redis through their own clients, never through this lock.
    redis: tokio::sync::Mutex<Backend>,
    /// The serve processes, one slot each; owned like `redis` (the fault task, then the
    /// healing phase). Drivers read the serves' addresses from `bases`, never these slots.
    serves: Vec<tokio::sync::Mutex<Option<Serve>>>,
    bases: RwLock<Vec<String>>,
    /// Stopped serves, kept so their logs outlive them (printed if the test panics).
    graveyard: Mutex<Vec<Serve>>,
    serve_config: String,
    pub http: reqwest::Client,
    pub client: Client,
    /// Set for the final phase: the receiver and the handler stop failing.
    pub healing: AtomicBool,
    /// Receiver verdicts per mille: (fail, hang).
    rates: (u64, u64),
    /// Violations seen while running (a serve that would not start, ...).
    findings: Mutex<Vec<String>>,
}

impl World {
    /// serve number `i`'s `http://127.0.0.1:<port>` (it changes when serve is replaced).
    pub fn base(&self, i: usize) -> String {
        self.bases.read().unwrap()[i].clone()
    }

    pub fn serve_count(&self) -> usize {
        self.serves.len()
    }

    /// The verdict on one delivery attempt: the same for the same delivery, whatever the
    /// interleaving.
    pub fn verdict(&self, queue: &str, id: &str, group: &str, due: i64, attempt: u32) -> Answer {
        if self.healing.load(Ordering::SeqCst) || !self.cfg.has(FaultClass::Receiver) {
            return Answer::Ok;
        }
        let roll = mix(
            self.cfg.seed,
            &[
                queue.as_bytes(),
                id.as_bytes(),
                group.as_bytes(),
                &due.to_le_bytes(),
                &attempt.to_le_bytes(),
            ],
        ) % 1000;
        if roll < self.rates.0 {
            Answer::Fail
        } else if roll < self.rates.0 + self.rates.1 {
            Answer::Hang
        } else {
            Answer::Ok
        }
    }
}

/// Redis `TIME` and this host's clock are one clock: a local reading before and after
/// `TIME` brackets it (to the millisecond). The receiver's timestamps rely on it.
async fn check_clock(client: &Client) -> Result<(), String> {
    let before = now_ms();
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut client.connection())
        .await
        .map_err(|e| format!("TIME: {e}"))?;
    let after = now_ms();
    let redis_ms = s * 1000 + us / 1000;
    if before <= redis_ms && redis_ms <= after {
        Ok(())
    } else {
        Err(format!(
            "Redis TIME {redis_ms} ms is not between this host's readings {before} and {after}: \
             the receiver's clock is not Redis's"
        ))
    }
}

/// The durability of the `sentinel` world's serves and library client:
/// `DELAYQ_CHAOS_DURABILITY` (`leader` or `replicated`), by default `replicated`
/// (docs/production-redis.md's recommended settings: a `WAIT` on every replica). The
/// single-Redis world has no replica and always runs `leader`.
pub fn sentinel_durability() -> &'static str {
    match std::env::var("DELAYQ_CHAOS_DURABILITY")
        .as_deref()
        .map(str::trim)
    {
        Err(_) | Ok("") | Ok("replicated") => "replicated",
        Ok("leader") => "leader",
        Ok(other) => panic!("DELAYQ_CHAOS_DURABILITY: leader or replicated, got {other:?}"),
    }
}

fn serve_config(redis_url: &str, hook_port: u16, durability: &str) -> String {
    let mut c = format!(
        r#"
redis_url = "{redis_url}"
durability = "{durability}"
shutdown_grace = "3s"
startup_timeout = "120s"
[http]
listen = "127.0.0.1:{{port}}"
request_timeout = "10s"
"#
    );
    for q in [QUEUE, EPH] {
        c.push_str(&format!(
            r#"
[[handlers]]
queue = "{q}"
group = "{HOOK}"
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
timeout = "{}s"
concurrency = 8
max_attempts = 3
backoff = "fixed:100ms"
visibility_timeout = "5s"
"#,
            HANDLER_TIMEOUT.as_secs()
        ));
    }
    c
}

/// The webhook receiver: logs every request (id, attempt, time) and answers by the
/// seeded verdict. Returns its port.
async fn start_receiver(world: Arc<std::sync::OnceLock<Arc<World>>>) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let world = world.clone();
            async move {
                let received_ms = now_ms();
                let Some(w) = world.get().cloned() else {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                };
                let v: serde_json::Value = match serde_json::from_str(&body) {
                    Ok(v) => v,
                    Err(_) => return axum::http::StatusCode::BAD_REQUEST,
                };
                let d = Delivery {
                    queue: v["queue"].as_str().unwrap_or_default().to_owned(),
                    id: v["id"].as_str().unwrap_or_default().to_owned(),
                    group: v["group"].as_str().unwrap_or_default().to_owned(),
                    due_ms: v["due_at_ms"].as_i64().unwrap_or(i64::MIN),
                    attempt: u32::try_from(v["attempt"].as_u64().unwrap_or(0)).unwrap_or(0),
                    received_ms,
                    dispatched_ms: None,
                    answer: Answer::Ok,
                };
                let answer = w.verdict(&d.queue, &d.id, &d.group, d.due_ms, d.attempt);
                w.hist.delivery(Delivery { answer, ..d });
                match answer {
                    Answer::Ok => axum::http::StatusCode::OK,
                    Answer::Fail => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    Answer::Hang => {
                        tokio::time::sleep(HANDLER_TIMEOUT + Duration::from_millis(500)).await;
                        axum::http::StatusCode::OK
                    }
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    port
}

/// Runs the library worker (group [`LIB`] on [`QUEUE`]) until `stop`.
fn spawn_lib_worker(w: Arc<World>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let ww = w.clone();
        let handler = move |d: delayq::Delivery| {
            let w = ww.clone();
            async move {
                let received_ms = now_ms();
                let answer = w.verdict(&d.queue, &d.id, &d.group, d.due_at_ms, d.attempt);
                w.hist.delivery(Delivery {
                    queue: d.queue.clone(),
                    id: d.id.clone(),
                    group: d.group.clone(),
                    due_ms: d.due_at_ms,
                    attempt: d.attempt,
                    received_ms,
                    dispatched_ms: Some(d.dispatched_at_ms),
                    answer,
                });
                match answer {
                    Answer::Ok => Ok(()),
                    Answer::Fail => Err(delayq::HandlerError::retry("chaos: seeded failure")),
                    Answer::Hang => {
                        tokio::time::sleep(HANDLER_TIMEOUT + Duration::from_millis(500)).await;
                        Ok(())
                    }
                }
            }
        };
        let opts = WorkerOptions::default()
            .consumer("chaos-lib")
            .concurrency(8)
            .prefetch(24)
            .handler_timeout(HANDLER_TIMEOUT)
            .max_attempts(3)
            .backoff(Backoff::parse("fixed:100ms").unwrap())
            .visibility_timeout(Duration::from_secs(5))
            .reclaim_every(Duration::from_millis(500))
            .block(Duration::from_millis(200));
        let worker = Worker::new(&w.client, QUEUE, LIB, handler, opts).unwrap();
        if let Err(e) = worker.run(stop).await {
            eprintln!("  the library worker stopped: {e}");
        }
    })
}

impl World {
    /// Replaces serve `i`: SIGKILL (`graceful` false) or SIGTERM awaited, then a new one
    /// on the same config, ready.
    pub async fn replace_serve(&self, i: usize, graceful: bool) {
        let mut slot = self.serves[i].lock().await;
        if let Some(mut old) = slot.take() {
            if let Ok(Some(status)) = old.child.try_wait() {
                let log = old.log();
                let tail: Vec<&str> = log.lines().rev().take(6).collect();
                self.finding(format!(
                    "[serve-died] serve {i} had exited on its own ({status}) before its fault; its last log lines, newest first: {}",
                    tail.join(" | ")
                ));
            } else if graceful {
                old.sigterm();
                let code = old.wait_exit(Duration::from_secs(30)).await;
                self.hist
                    .fault(format!("serve {i} SIGTERM: exited {code:?}"));
                if code != Some(0) {
                    let log = old.log();
                    let tail: Vec<&str> = log.lines().rev().take(6).collect();
                    self.finding(format!(
                        "[serve-exit] serve {i} exited {code:?} on SIGTERM (0 expected); its last log lines, newest first: {}",
                        tail.join(" | ")
                    ));
                }
            } else {
                let _ = old.child.kill();
                let _ = old.child.wait();
                self.hist.fault(format!("serve {i} SIGKILL"));
            }
            self.graveyard.lock().unwrap().push(old);
        }
        // A serve that fails to start is a finding; the campaign goes on with another.
        for _ in 0..5 {
            let config = self.serve_config.clone();
            let started = tokio::spawn(async move {
                let mut fresh = Serve::start(&config, None);
                fresh.wait_ready(WAIT).await;
                fresh
            })
            .await;
            match started {
                Ok(fresh) => {
                    self.bases.write().unwrap()[i] = fresh.base();
                    *slot = Some(fresh);
                    return;
                }
                Err(e) => {
                    let why = e
                        .try_into_panic()
                        .ok()
                        .and_then(|p| p.downcast::<String>().ok())
                        .map_or_else(|| "?".to_owned(), |s| *s);
                    let last = why
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty() && *l != "\"");
                    self.finding(format!(
                        "[serve-start] serve {i} did not start after a {}: {}",
                        if graceful { "SIGTERM" } else { "SIGKILL" },
                        last.unwrap_or("?")
                    ));
                }
            }
        }
    }

    /// Records a violation found while the campaign runs (not by the final check).
    pub fn finding(&self, v: String) {
        eprintln!("  {v}");
        self.findings.lock().unwrap().push(v);
    }

    /// SIGKILL of Redis, restarted on the same port and directory (AOF replayed); with
    /// Sentinel, SIGKILL of the current master (see [`World::kill_master`]).
    pub async fn kill_redis(&self) {
        let mut b = self.redis.lock().await;
        match &mut *b {
            Backend::Single(r) => {
                r.kill();
                self.hist.fault("redis SIGKILL".into());
                tokio::task::block_in_place(|| r.restart()).expect("restart redis");
                self.hist.fault("redis restarted".into());
            }
            Backend::Sentinel(set) => self.kill_master(set).await,
        }
    }

    /// SIGSTOP of Redis (with Sentinel: of the current master) for `ms`, then SIGCONT.
    pub async fn freeze_redis(&self, ms: u64) {
        let mut b = self.redis.lock().await;
        let pid = match &mut *b {
            Backend::Single(r) => {
                r.suspend().unwrap();
                None
            }
            Backend::Sentinel(set) => {
                let Some(i) = set.master_index().await else {
                    self.hist
                        .fault("redis SIGSTOP skipped: no master named".into());
                    return;
                };
                let pid = set.data[i].child.as_ref().map(std::process::Child::id);
                signal(pid, "-STOP");
                pid
            }
        };
        self.hist.fault(format!("redis SIGSTOP for {ms} ms"));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        match &mut *b {
            Backend::Single(r) => r.resume().unwrap(),
            Backend::Sentinel(_) => signal(pid, "-CONT"),
        }
        self.hist.fault("redis SIGCONT".into());
        if let Backend::Sentinel(set) = &mut *b {
            // A freeze past `down-after-milliseconds` fails over: await the set settled.
            self.settle(set).await;
        }
    }

    /// `SENTINEL FAILOVER` through one sentinel; then awaits the new master with every
    /// replica following it.
    pub async fn sentinel_failover(&self) {
        let mut b = self.redis.lock().await;
        let Backend::Sentinel(set) = &mut *b else {
            return;
        };
        let before = set.master_port().await;
        let answer: redis::RedisResult<String> = sentinel::raw(
            &set.sentinels[0].url(),
            &["SENTINEL", "FAILOVER", sentinel::MASTER],
        )
        .await;
        self.hist.fault(format!(
            "redis SENTINEL FAILOVER (master port {before:?}): {}",
            match &answer {
                Ok(a) => a.clone(),
                Err(e) => e.to_string(),
            }
        ));
        if answer.is_ok() {
            let sentinels = set.sentinel_urls();
            let moved = crate::support::poll(WAIT, || async {
                let now = sentinel::master_port(&sentinels[0]).await;
                (now.is_some() && now != before).then_some(())
            })
            .await;
            if moved.is_none() {
                self.hist
                    .fault("redis SENTINEL FAILOVER: no new master named in time".into());
            }
        }
        self.settle(set).await;
    }

    /// SIGKILL of the master the sentinels name; once they name another, a replacement
    /// replica of it is started (two replicas again, so `min-replicas-to-write 1` is met
    /// after the next kill too).
    async fn kill_master(&self, set: &mut SentinelSet) {
        let Some(i) = set.master_index().await else {
            self.hist
                .fault("redis SIGKILL of the master skipped: no master named".into());
            return;
        };
        let mut old = set.data.remove(i);
        old.kill();
        self.hist
            .fault(format!("redis SIGKILL of the master (port {})", old.port));
        let old_port = old.port;
        set.graveyard.push(old);
        let sentinels = set.sentinel_urls();
        let new = crate::support::poll(WAIT, || async {
            let now = sentinel::master_port(&sentinels[0]).await?;
            (now != old_port).then_some(now)
        })
        .await;
        let Some(new) = new else {
            self.hist
                .fault("redis: no new master named in time after the kill".into());
            return;
        };
        self.hist.fault(format!("redis master is now port {new}"));
        let n = set.started;
        set.started += 1;
        set.data.push(Proc::data_with(
            &format!("replacement{n}"),
            Some(new),
            &set.extra,
        ));
        self.settle(set).await;
    }

    /// Awaits (bounded) a set with a master the sentinels agree on and every other data
    /// server a replica in sync with it, seen by every sentinel.
    async fn settle(&self, set: &mut SentinelSet) {
        let sentinels = set.sentinel_urls();
        let ports: Vec<u16> = set.data.iter().map(|p| p.port).collect();
        let ok = crate::support::poll(WAIT, || async {
            let m = sentinel::master_port(&sentinels[0]).await?;
            for s in &sentinels[1..] {
                if sentinel::master_port(s).await != Some(m) {
                    return None;
                }
            }
            for &p in ports.iter().filter(|&&p| p != m) {
                if !sentinel::replica_in_sync(&format!("redis://127.0.0.1:{p}")).await
                    || !sentinel::sentinels_see_replica(&sentinels, p).await
                {
                    return None;
                }
            }
            Some(())
        })
        .await;
        if ok.is_none() {
            self.hist
                .fault("redis: the Sentinel set did not settle in time".into());
        }
    }
}

/// Sends `kill <sig>` to `pid`.
fn signal(pid: Option<u32>, sig: &str) {
    if let Some(pid) = pid {
        let _ = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status();
    }
}

/// The Redis the campaign runs on.
pub enum Backend {
    /// One `redis-server` with AOF.
    Single(LocalRedis),
    /// A Sentinel-managed master and replicas ([`FaultClass::Sentinel`]).
    Sentinel(SentinelSet),
}

/// A master, its replicas and three sentinels.
pub struct SentinelSet {
    /// The data servers alive (master and replicas; which is which, the sentinels say).
    pub data: Vec<Proc>,
    pub sentinels: Vec<Proc>,
    /// Config lines of every data server.
    pub extra: Vec<String>,
    /// Killed data servers, kept for their logs.
    pub graveyard: Vec<Proc>,
    /// Replacements started so far.
    pub started: usize,
}

impl SentinelSet {
    fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Proc::url).collect()
    }

    async fn master_port(&self) -> Option<u16> {
        sentinel::master_port(&self.sentinels[0].url()).await
    }

    async fn master_index(&self) -> Option<usize> {
        let m = self.master_port().await?;
        self.data.iter().position(|p| p.port == m)
    }

    /// SIGCONT to every data server (a frozen master thawed).
    fn resume_all(&self) {
        for p in &self.data {
            signal(p.child.as_ref().map(std::process::Child::id), "-CONT");
        }
    }
}

/// The fault injector: one fault at a time, every 1.5-4 s, chosen by the seeded RNG among
/// the enabled classes.
async fn inject_faults(w: Arc<World>, stop: CancellationToken) {
    let mut rng = fastrand::Rng::with_seed(mix(w.cfg.seed, &[b"faults"]));
    let classes: Vec<FaultClass> = [
        FaultClass::ServeKill,
        FaultClass::ServeTerm,
        FaultClass::RedisKill,
        FaultClass::RedisStop,
        FaultClass::Sentinel,
    ]
    .into_iter()
    .filter(|f| w.cfg.has(*f))
    .collect();
    if classes.is_empty() {
        return;
    }
    loop {
        let pause = Duration::from_millis(rng.u64(1500..4000));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        match classes[rng.usize(..classes.len())] {
            FaultClass::ServeKill => {
                let i = rng.usize(..w.serve_count());
                w.replace_serve(i, false).await;
            }
            FaultClass::ServeTerm => {
                let i = rng.usize(..w.serve_count());
                w.replace_serve(i, true).await;
            }
            FaultClass::RedisKill => w.kill_redis().await,
            FaultClass::Sentinel => {
                if rng.bool() {
                    w.sentinel_failover().await;
                } else {
                    w.kill_redis().await;
                }
            }
            FaultClass::RedisStop => {
                let ms = rng.u64(200..2000);
                w.freeze_redis(ms).await;
            }
            _ => {}
        }
    }
}

/// One campaign from start to checked report.
pub async fn run(cfg: Campaign) -> Report {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = now_ms();
    let mut rng = fastrand::Rng::with_seed(mix(cfg.seed, &[b"world"]));
    // `always`: the setting under which a Redis crash loses nothing acknowledged
    // (ARCHITECTURE.md, "Durability"; `everysec` may lose up to ~2 s while fsync is slow).
    let (redis, redis_url) = if cfg.has(FaultClass::Sentinel) {
        // docs/production-redis.md's recommended settings: `min-replicas-to-write 1` (two
        // replicas, so writes come back after a master kill), AOF `always`.
        let extra: Vec<String> = [
            "appendonly yes",
            "appendfsync always",
            "min-replicas-to-write 1",
            "min-replicas-max-lag 10",
        ]
        .map(str::to_owned)
        .to_vec();
        // `DELAYQ_CHAOS_REPLICAS` (default 2): how many replicas follow the master.
        let n = std::env::var("DELAYQ_CHAOS_REPLICAS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2);
        let (master, replicas, sentinels, url) = sentinel::sentinel_group_n(&extra, n).await;
        let mut data = vec![master];
        data.extend(replicas);
        let set = SentinelSet {
            data,
            sentinels,
            extra,
            graveyard: Vec::new(),
            started: 0,
        };
        (Backend::Sentinel(set), url)
    } else {
        let redis = LocalRedis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
            .expect("start redis-server");
        let url = redis.url();
        (Backend::Single(redis), url)
    };
    let durability = if cfg.has(FaultClass::Sentinel) {
        sentinel_durability()
    } else {
        "leader"
    };
    let client_durability = match durability {
        "replicated" => delayq::Durability::replicated(),
        _ => delayq::Durability::Leader,
    };
    let client = Client::connect_with(
        &redis_url,
        delayq::ClientOptions::default().durability(client_durability),
    )
    .await
    .expect("connect");
    check_clock(&client).await.unwrap();
    for q in [QUEUE, EPH] {
        client.admin().create_queue(q, 1).await.unwrap();
    }
    let slot: Arc<std::sync::OnceLock<Arc<World>>> = Arc::default();
    let hook_port = start_receiver(slot.clone()).await;
    let serve_config = serve_config(&redis_url, hook_port, durability);
    let mut serves = Vec::new();
    let mut bases = Vec::new();
    for _ in 0..2 {
        let mut s = Serve::start(&serve_config, None);
        s.wait_ready(WAIT).await;
        bases.push(s.base());
        serves.push(tokio::sync::Mutex::new(Some(s)));
    }
    // Failure rates drawn by the seed: 5-20 % fail, 0-5 % hang.
    let rates = (rng.u64(50..200), rng.u64(0..50));
    let w = Arc::new(World {
        cfg: cfg.clone(),
        hist: History::default(),
        redis: tokio::sync::Mutex::new(redis),
        serves,
        bases: RwLock::new(bases),
        graveyard: Mutex::new(Vec::new()),
        serve_config,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
            .unwrap(),
        client,
        healing: AtomicBool::new(false),
        rates,
        findings: Mutex::new(Vec::new()),
    });
    let _ = slot.set(w.clone());
    eprintln!(
        "  redis {redis_url} (AOF always), durability {durability}, serves {:?}, receiver 127.0.0.1:{hook_port}, fail {}‰ hang {}‰, faults {:?}",
        w.bases.read().unwrap(),
        rates.0,
        rates.1,
        cfg.faults.iter().map(|f| f.name()).collect::<Vec<_>>()
    );

    let worker_stop = CancellationToken::new();
    let worker = spawn_lib_worker(w.clone(), worker_stop.clone());

    // The campaign: drivers and faults for `duration`.
    let stop = CancellationToken::new();
    let faults = tokio::spawn(inject_faults(w.clone(), stop.clone()));
    let drivers = crate::drive::spawn_all(&w, &stop);
    tokio::time::sleep(cfg.duration).await;
    stop.cancel();
    let mut violations = Vec::new();
    if let Err(e) = faults.await {
        violations.push(format!("[harness] the fault injector failed: {e}"));
    }
    for d in drivers {
        if let Err(e) = d.await {
            violations.push(format!("[harness] a driver failed: {e}"));
        }
    }
    let injected_until = now_ms();

    // Heal: every process up, the receiver and handler answer OK, dead letters replayed
    // until every acknowledged order is delivered (or the bounded wait ends).
    w.healing.store(true, Ordering::SeqCst);
    match &mut *w.redis.lock().await {
        Backend::Single(r) => r.resume().unwrap(),
        Backend::Sentinel(set) => set.resume_all(),
    }
    for i in 0..w.serve_count() {
        let exited = match w.serves[i].lock().await.as_mut() {
            Some(s) => !matches!(s.child.try_wait(), Ok(None)),
            None => true,
        };
        if exited {
            // Reported by `replace_serve`, which starts a new one.
            w.replace_serve(i, false).await;
        }
    }
    let healed = crate::drive::heal(&w).await;
    let healed_at = now_ms();
    worker_stop.cancel();
    let _ = tokio::time::timeout(WAIT, worker).await;

    violations.append(&mut w.findings.lock().unwrap());
    let mut checked = crate::check::check(&w, &healed).await;
    violations.append(&mut checked.violations);
    let faults_n = w.hist.faults.lock().unwrap().len();
    let report = Report {
        summary: format!(
            "fault campaign seed {}: {} ms of faults ({faults_n} fault events), healed in {} ms\n{}",
            cfg.seed,
            injected_until - started,
            healed_at - injected_until,
            checked.summary
        ),
        violations,
    };
    // Serves stop before Redis (drop order).
    for s in &w.serves {
        s.lock().await.take();
    }
    w.graveyard.lock().unwrap().clear();
    report
}
