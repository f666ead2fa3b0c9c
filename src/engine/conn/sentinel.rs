//! The master a set of Redis Sentinels names: resolving it, and the connection that
//! follows it through failovers.

use super::explain_tls;
use super::sentinel_policy::{Attempts, Verdict, is_permanent, judge};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, TlsCertificates, Value,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How to reach the master a set of sentinels names, and what the sentinels said last.
pub struct SentinelTarget {
    pub(super) master_name: String,
    /// Each sentinel's address and credentials.
    pub(super) sentinels: Vec<ConnectionInfo>,
    /// The master's credentials and database (its address is the sentinels' answer).
    pub(super) master: ConnectionInfo,
    pub(super) tls: bool,
    pub(super) certs: Option<TlsCertificates>,
    pub(super) watch: Watch,
}

/// The master the sentinels named when last asked (by the watcher), and how many times
/// that answer changed: a connection opened at another epoch reconnects.
#[derive(Default)]
pub(super) struct Watch {
    pub(super) started: AtomicBool,
    pub(super) epoch: AtomicU64,
    pub(super) master: Mutex<Option<(String, u16)>>,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Addresses only: never a credential.
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        f.debug_struct("SentinelTarget")
            .field("master_name", &self.master_name)
            .field("sentinels", &addrs)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl SentinelTarget {
    /// The master's name, as the sentinels know it.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinels' addresses (`host:port`).
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect()
    }

    pub(super) fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        match &self.certs {
            Some(c) => redis::Client::build_with_tls(info, c.clone()),
            None => redis::Client::open(info),
        }
    }

    pub(super) fn config(
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(connect_timeout))
    }

    /// Asks one sentinel where the master is.
    pub(super) async fn ask(
        &self,
        sentinel: &ConnectionInfo,
        timeout: Duration,
    ) -> RedisResult<Option<(String, u16)>> {
        let addr = sentinel.addr().to_string();
        let client = self.client(sentinel.clone())?;
        let mut c = client
            .get_multiplexed_async_connection_with_config(&Self::config(timeout, timeout))
            .await
            .map_err(|e| explain_tls(e, self.tls, &format!("sentinel {addr}")))?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query_async(&mut c)
            .await
    }

    /// Connects to `host:port` and checks that it is a master.
    pub(super) async fn open_master(
        &self,
        host: String,
        port: u16,
        response_timeout: Duration,
        connect_timeout: Duration,
        push: Option<&super::pubsub::Push>,
    ) -> RedisResult<MultiplexedConnection> {
        let what = format!("master {host}:{port}");
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let (info, config) = super::pubsub::with_push(
            self.master.clone().set_addr(addr),
            Self::config(response_timeout, connect_timeout),
            push,
        );
        let client = self.client(info)?;
        let mut c = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| explain_tls(e, self.tls, &what))?;
        // A sentinel may still name a demoted master for a moment: ask the server itself.
        // A user not allowed ROLE is trusted to the sentinels (a write to a replica still
        // answers READONLY, which resolves again).
        match c.req_packed_command(&redis::cmd("ROLE")).await? {
            Value::Array(items) => match items.first() {
                Some(Value::BulkString(role)) if role.as_slice() != b"master" => {
                    Err(RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ReadOnly),
                        "the server the sentinels name is not a master (yet)",
                        format!("{what} is a {}", String::from_utf8_lossy(role)),
                    )))
                }
                _ => Ok(c),
            },
            Value::ServerError(e) if e.code() == "NOPERM" => Ok(c),
            Value::ServerError(e) => Err(e.into()),
            _ => Ok(c),
        }
    }

    /// How many times the watcher saw the sentinels name another master.
    pub(super) fn epoch(&self) -> u64 {
        self.watch.epoch.load(Ordering::Acquire)
    }

    /// The master the watcher saw last.
    pub(super) fn watched_master(&self) -> Option<(String, u16)> {
        self.watch
            .master
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the sentinels' answer; a new master bumps the epoch.
    pub(super) fn saw_master(&self, addr: (String, u16)) {
        let mut m = self.watch.master.lock().unwrap_or_else(|p| p.into_inner());
        if m.as_ref() != Some(&addr) {
            if m.is_some() {
                self.watch.epoch.fetch_add(1, Ordering::AcqRel);
                tracing::info!(master = %self.master_name, addr = ?addr, "the sentinels name a new master: reconnecting");
            }
            *m = Some(addr);
        }
    }

    /// Starts, once, the watcher: a task that asks a sentinel every
    /// [`SENTINEL_WATCH_INTERVAL`] where the master is, so that every connection moves to a
    /// new master as soon as the sentinels name it, even while the old one still answers
    /// (a `SENTINEL FAILOVER` leaves it a master until the sentinels reconfigure it, about
    /// ten seconds later). It stops when the target is dropped.
    pub(super) fn watch(self: &Arc<Self>, timeout: Duration) {
        if self.watch.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watch.started.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut conn: Option<MultiplexedConnection> = None;
            let mut next = 0;
            loop {
                tokio::time::sleep(SENTINEL_WATCH_INTERVAL).await;
                let Some(target) = weak.upgrade() else { break };
                target.poll(&mut conn, &mut next, timeout).await;
            }
        });
    }

    /// Asks one sentinel (the one of `conn`, else the next that answers) where the master
    /// is.
    pub(super) async fn poll(
        &self,
        conn: &mut Option<MultiplexedConnection>,
        next: &mut usize,
        timeout: Duration,
    ) {
        for _ in 0..self.sentinels.len() {
            let c = match conn {
                Some(c) => c,
                None => {
                    let s = &self.sentinels[*next % self.sentinels.len()];
                    let opened = match self.client(s.clone()) {
                        Ok(client) => {
                            client
                                .get_multiplexed_async_connection_with_config(&Self::config(
                                    timeout, timeout,
                                ))
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    match opened {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            *next += 1;
                            continue;
                        }
                    }
                }
            };
            let answer: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query_async(c)
                .await;
            match answer {
                Ok(Some(addr)) => {
                    self.saw_master(addr);
                    return;
                }
                _ => {
                    *conn = None;
                    *next += 1;
                }
            }
        }
    }

    /// Finds the master through the sentinels (each asked in turn) and connects to it.
    pub(super) async fn connect_master(
        self: Arc<Self>,
        response_timeout: Duration,
        connect_timeout: Duration,
        push: Option<&super::pubsub::Push>,
    ) -> RedisResult<MultiplexedConnection> {
        let ask_timeout = connect_timeout.min(response_timeout);
        let mut last: Option<RedisError> = None;
        let mut tried: Vec<(String, u16)> = Vec::new();
        // The watcher's latest answer first (the one that moved the epoch), then each
        // sentinel's.
        let watched = self.watched_master();
        for s in std::iter::once(None).chain(self.sentinels.iter().map(Some)) {
            let answer = match s {
                None => match &watched {
                    Some(a) => Ok(Some(a.clone())),
                    None => continue,
                },
                Some(s) => self.ask(s, ask_timeout).await,
            };
            let (host, port) = match answer {
                Ok(Some(a)) => a,
                Ok(None) => {
                    let addr = s.map(|s| s.addr().to_string()).unwrap_or_default();
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "the sentinel does not know this master name",
                        format!("sentinel {addr} about {:?}", self.master_name),
                    )));
                    continue;
                }
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            if tried.contains(&(host.clone(), port)) {
                continue;
            }
            tried.push((host.clone(), port));
            match self
                .open_master(host, port, response_timeout, connect_timeout, push)
                .await
            {
                Ok(c) => {
                    tracing::debug!(master = %self.master_name, addr = ?tried.last(), "connected to the master the sentinels name");
                    return Ok(c);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::EmptySentinelList, "no sentinel to ask"))
        }))
    }
}

/// A connection being opened (shared by every caller that waits for it).
pub(super) type Connecting = Shared<BoxFuture<'static, RedisResult<MultiplexedConnection>>>;

/// How often the watcher asks a sentinel where the master is.
pub(super) const SENTINEL_WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// A connection to the master that Redis Sentinels name, followed across failovers.
///
/// Clones share one multiplexed connection. When it breaks or times out, when the server
/// answers as a replica (`READONLY`, or `UNBLOCKED` for a blocked read on a demoted
/// master) or refuses writes for want of replicas (`NOREPLICAS`, see
/// [`sentinel_policy::REFUSED_FOR_ROLE`]), or when the target's watcher hears the sentinels name another master (it asks
/// every 500 ms), the master is resolved through the sentinels again and a new connection
/// opened, once for all clones. A call that the server refused so did nothing and is
/// retried on the new master (bounded attempts with doubling delays, within the response
/// plus the connect timeout); a call whose connection broke may have run, so its error is
/// returned (the caller retries what is idempotent) and the next call reconnects. No lock is
/// held across a network call.
#[derive(Clone)]
pub struct SentinelConn {
    pub(super) shared: Arc<SentinelShared>,
}

pub(super) struct SentinelShared {
    pub(super) target: Arc<SentinelTarget>,
    pub(super) response_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) slot: Mutex<Slot>,
}

/// The current connection (or its opening), its generation, and the watcher's epoch when
/// it was opened.
pub(super) struct Slot {
    pub(super) generation: u64,
    pub(super) epoch: u64,
    pub(super) conn: Connecting,
}

/// One call: a command or a pipeline.
#[derive(Clone, Copy)]
pub(super) enum Request<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

/// The reply to a [`Request`].
pub(super) enum Reply {
    One(Value),
    Many(Vec<Value>),
}

impl Reply {
    /// The reply's values (one, or a pipeline's).
    pub(super) fn values(&self) -> &[Value] {
        match self {
            Reply::One(v) => std::slice::from_ref(v),
            Reply::Many(vs) => vs,
        }
    }
}

impl SentinelConn {
    pub(super) fn new(
        target: Arc<SentinelTarget>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let conn = Self::connecting(&target, response_timeout, connect_timeout);
        let epoch = target.epoch();
        SentinelConn {
            shared: Arc::new(SentinelShared {
                target,
                response_timeout,
                connect_timeout,
                slot: Mutex::new(Slot {
                    generation: 0,
                    epoch,
                    conn,
                }),
            }),
        }
    }

    pub(super) fn connecting(
        target: &Arc<SentinelTarget>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Connecting {
        target
            .clone()
            .connect_master(response_timeout, connect_timeout, None)
            .boxed()
            .shared()
    }

    pub(super) fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.shared.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection's generation, epoch and (possibly unfinished) opening.
    pub(super) fn current(&self) -> (u64, u64, Connecting) {
        let s = self.slot();
        (s.generation, s.epoch, s.conn.clone())
    }

    /// Replaces the connection of `generation` with a new resolution (unless another caller
    /// already did).
    pub(super) fn invalidate(&self, generation: u64) {
        let mut s = self.slot();
        if s.generation == generation {
            s.generation += 1;
            s.epoch = self.shared.target.epoch();
            s.conn = Self::connecting(
                &self.shared.target,
                self.shared.response_timeout,
                self.shared.connect_timeout,
            );
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.shared.response_timeout + self.shared.connect_timeout
    }

    /// A connection to the master, resolving it as often as needed within `deadline`.
    pub(super) async fn obtain(
        &self,
        deadline: Instant,
    ) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut attempts = Attempts::new(deadline);
        loop {
            attempts.start();
            let (generation, epoch, connecting) = self.current();
            if epoch != self.shared.target.epoch() {
                // The sentinels named another master since this connection was opened.
                self.invalidate(generation);
                continue;
            }
            let e = match tokio::time::timeout_at(deadline, connecting).await {
                Ok(Ok(c)) => return Ok((generation, c)),
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "no master for {:?} through the sentinels within the timeout",
                            self.shared.target.master_name
                        ),
                    )));
                }
            };
            self.invalidate(generation);
            let Some(wait) = attempts.after_failure(is_permanent(&e), Instant::now()) else {
                return Err(e);
            };
            tracing::debug!(master = %self.shared.target.master_name, error = %e, "resolving the master again");
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits for the first connection (at connect time, so a bad URL or an unreachable
    /// set of sentinels fails there).
    pub(super) async fn ready(&self) -> RedisResult<()> {
        self.obtain(self.deadline()).await.map(drop)
    }

    pub(super) async fn request(&self, req: Request<'_>) -> RedisResult<Reply> {
        let deadline = self.deadline();
        let mut attempts = Attempts::new(deadline);
        loop {
            attempts.start();
            let (generation, mut c) = self.obtain(deadline).await?;
            let sent = match req {
                Request::One(cmd) => c.req_packed_command(cmd).await.map(Reply::One),
                Request::Many(p, offset, count) => c
                    .req_packed_commands(p, offset, count)
                    .await
                    .map(Reply::Many),
            };
            match judge(sent.as_ref().map(Reply::values)) {
                Verdict::Refused => {
                    // A replica (or a master short of replicas) refused it: nothing was
                    // done; find the master again.
                    self.invalidate(generation);
                    match attempts.after_failure(false, Instant::now()) {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => return sent,
                    }
                }
                Verdict::Answer | Verdict::Failed => return sent,
                Verdict::MayHaveRun => {
                    // It may have run: no retry here; the next call reconnects.
                    self.invalidate(generation);
                    return sent;
                }
            }
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.request(Request::One(cmd)).await? {
                Reply::One(v) => Ok(v),
                Reply::Many(_) => Err(RedisError::from((
                    ErrorKind::Client,
                    "a pipeline reply to one command",
                ))),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.request(Request::Many(pipeline, offset, count)).await? {
                Reply::Many(v) => Ok(v),
                Reply::One(_) => Err(RedisError::from((
                    ErrorKind::Client,
                    "one reply to a pipeline",
                ))),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.target.master.redis_settings().db()
    }
}
