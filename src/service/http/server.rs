//! The HTTP server: one accept loop, each connection in a task of its own, watched.
//!
//! - **Connections are capped.** At most the cap are served at once; beyond it the loop stops
//!   accepting, so new connections wait in the kernel's listen backlog and never take the
//!   process's file descriptors. The cap stays under the open-files limit, which is raised
//!   to its hard limit at start-up ([`connection_cap`]), with room kept for Redis, the
//!   database and outbound webhooks.
//! - **Every connection has a deadline** in each of its phases: idle (no request in progress,
//!   no byte of the next one) for at most `idle_timeout`; from the first byte of a request to
//!   its complete head at most `header_timeout`; the body and the handler are bounded by the
//!   router's own deadlines (`read_body`); a response the client does not drain (the socket
//!   takes no byte for `write_timeout`) is cut off too, whatever the phase, and so is one the
//!   process has already handed to the kernel's buffers (`TCP_USER_TIMEOUT` set to
//!   `write_timeout`: the kernel closes a connection whose client takes no byte for that
//!   long). A slowloris, slow or never-reading, is cut off, never kept.
//! - **Shutdown is bounded.** Once cancelled the loop stops accepting; idle connections and
//!   half-sent requests (a head, or a body, not arrived whole) are closed at once, running
//!   requests finish (then their connections close), and whatever is left after the grace
//!   period is cut off.

use super::HttpLimits;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest request head hyper buffers: at most this memory per connection. Heads over the
/// router's limits (8 KiB targets, 16 KiB and 100 headers) get the envelope from the
/// router; longer ones ([`MAX_REQUEST_LINE`], [`MAX_HEAD`]) from the connection itself, so
/// no answer is hyper's bare one: a 100 KB target is 414 and 400 headers are 431, in JSON.
const MAX_HEAD_BUFFER: usize = 128 * 1024;
/// Most headers hyper parses (beyond, its own bare 431); the router refuses above 100.
const HYPER_MAX_HEADERS: usize = 512;
/// A request line longer than this is answered 414 (in the envelope) by the connection
/// itself, before hyper (which answers bare beyond 64 KiB) parses it.
const MAX_REQUEST_LINE: usize = 2 * super::limits::MAX_URI_BYTES;
/// A head longer than this is answered 431 (in the envelope) by the connection itself,
/// before hyper's buffer fills.
const MAX_HEAD: usize = MAX_HEAD_BUFFER - 4096;

/// Raises the soft open-files limit to the hard one and returns how many connections to
/// serve at once: `wanted`, or fewer so that `reserve` descriptors stay free for everything
/// else (Redis, the database, outbound webhooks, files).
pub fn connection_cap(wanted: usize, reserve: u64) -> usize {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => {
            let room = usize::try_from(soft.saturating_sub(reserve)).unwrap_or(usize::MAX);
            let cap = wanted.min(room.max(16));
            if cap < wanted {
                tracing::warn!(
                    open_files = soft,
                    reserve,
                    cap,
                    "the open-files limit allows fewer HTTP connections than http.max_connections"
                );
            }
            cap
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read or raise the open-files limit");
            wanted
        }
    }
}

/// Serves `router` on `listener` until `cancel`, then shuts down within `grace`. The
/// listener is shared: `serve` answers on it while it waits for Redis at start-up (see
/// [`starting_router`]), then hands it to the full API.
pub async fn serve(
    listener: Arc<TcpListener>,
    router: Router,
    limits: HttpLimits,
    max_connections: usize,
    cancel: CancellationToken,
    grace: Duration,
) {
    let limits = Arc::new(limits);
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut conns: JoinSet<()> = JoinSet::new();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = cancel.cancelled() => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = cancel.cancelled() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                // What the process has handed to the kernel counts too: a response that fits
                // in the socket's buffers, which the client never takes, times the
                // connection out after write_timeout (the kernel closes it).
                let _ = socket2::SockRef::from(&stream)
                    .set_tcp_user_timeout(Some(limits.write_timeout));
                conns.spawn(connection(
                    stream,
                    peer,
                    router.clone(),
                    limits.clone(),
                    cancel.clone(),
                    permit,
                ));
            }
            Err(e) => {
                // Out of descriptors or a transient accept failure: back off briefly.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = cancel.cancelled() => break,
                }
            }
        }
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            left = conns.len(),
            "HTTP connections still open after the grace period: closing them"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// No request in progress, no byte of the next one yet.
const IDLE: u8 = 0;
/// Bytes of a request head have arrived; the head is not complete yet.
const HEAD: u8 = 1;
/// A request is being handled (its head is complete).
const REQUEST: u8 = 2;

/// A connection's phase and since when, shared by its I/O, its service and its watchdog.
struct Activity {
    epoch: Instant,
    phase: AtomicU8,
    /// Ms since `epoch` when the phase began.
    since_ms: AtomicU64,
    /// 1 + ms since `epoch` when a write first found the socket full and nothing has been
    /// written since (0: writes are going through).
    blocked_ms: AtomicU64,
    /// The running request's body has not arrived whole yet (a half-sent request: closed
    /// at once on shutdown).
    body_pending: AtomicBool,
    /// The kernel timed the connection out (`TCP_USER_TIMEOUT`: its client took no byte of
    /// what it was sent for `write_timeout`).
    timed_out: AtomicBool,
    /// Woken on every phase change, so the watchdog sleeps until the right deadline.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            epoch: Instant::now(),
            phase: AtomicU8::new(IDLE),
            since_ms: AtomicU64::new(0),
            blocked_ms: AtomicU64::new(0),
            body_pending: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    fn set(&self, phase: u8) {
        self.since_ms.store(self.now_ms(), Ordering::SeqCst);
        self.phase.store(phase, Ordering::SeqCst);
        self.changed.notify_one();
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    /// A write found the socket full (the client is not reading): starts the write
    /// deadline unless it already runs.
    fn write_blocked(&self) {
        if self
            .blocked_ms
            .compare_exchange(0, self.now_ms() + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// Notes an I/O error that means the kernel timed the connection out.
    fn io_error(&self, e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::TimedOut {
            self.timed_out.store(true, Ordering::SeqCst);
        }
    }

    /// A write went through: the client drains what it is sent.
    fn wrote(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) != 0 {
            self.blocked_ms.store(0, Ordering::SeqCst);
            self.changed.notify_one();
        }
    }

    /// When the connection runs out of time (`None`: a request is running, the router bounds
    /// it, and its writes are going through), and why.
    fn deadline(&self, l: &HttpLimits) -> Option<(Instant, &'static str)> {
        let since = self.epoch + Duration::from_millis(self.since_ms.load(Ordering::SeqCst));
        let phase = match self.phase() {
            IDLE => Some((since + l.idle_timeout, "idle")),
            HEAD => Some((since + l.header_timeout, "header")),
            _ => None,
        };
        let blocked = match self.blocked_ms.load(Ordering::SeqCst) {
            0 => None,
            b => Some((
                self.epoch + Duration::from_millis(b - 1) + l.write_timeout,
                "write",
            )),
        };
        match (phase, blocked) {
            (Some(p), Some(w)) => Some(if w.0 < p.0 { w } else { p }),
            (p, w) => p.or(w),
        }
    }
}

/// A connection's socket, noting when the first bytes of a request arrive, and measuring
/// request heads as they arrive.
struct Tracked {
    inner: TcpStream,
    act: Arc<Activity>,
    head: HeadScan,
}

/// How much of the current request head has arrived.
#[derive(Default)]
struct HeadScan {
    /// Head bytes so far.
    bytes: usize,
    /// The request line is complete (its `\n` arrived).
    line_done: bool,
    /// The head is complete (`\r\n\r\n` arrived).
    done: bool,
    /// The last four bytes, to find `\r\n\r\n` across reads.
    tail: u32,
    /// The head was refused and answered: what arrives from now on is discarded.
    refused: bool,
}

impl HeadScan {
    /// Takes newly arrived head bytes; `Some(status)` when the head is over a limit.
    fn take(&mut self, bytes: &[u8]) -> Option<axum::http::StatusCode> {
        for &b in bytes {
            if self.done {
                break;
            }
            self.bytes += 1;
            self.line_done |= b == b'\n';
            self.tail = (self.tail << 8) | u32::from(b);
            self.done = self.tail == 0x0d0a_0d0a;
        }
        if self.done {
            None
        } else if !self.line_done && self.bytes > MAX_REQUEST_LINE {
            Some(axum::http::StatusCode::URI_TOO_LONG)
        } else if self.bytes > MAX_HEAD {
            Some(axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        } else {
            None
        }
    }
}

impl Tracked {
    /// Answers an over-long head in the envelope and half-closes: the client reads the
    /// answer, then the end of the stream; its remaining bytes are read and dropped until
    /// it closes (or the head deadline ends the connection).
    fn refuse(&mut self, status: axum::http::StatusCode) {
        let bytes = super::ApiError::for_status(status, "").wire_bytes();
        let sock = socket2::SockRef::from(&self.inner);
        // A fresh connection's send buffer is empty: the short answer fits at once.
        let _ = sock.send(&bytes);
        let _ = sock.shutdown(std::net::Shutdown::Write);
        self.head.refused = true;
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.head.refused {
            // Drain and drop until the client closes; hyper sees only the end.
            let mut scratch = [0u8; 8192];
            loop {
                let mut sb = ReadBuf::new(&mut scratch);
                match Pin::new(&mut this.inner).poll_read(cx, &mut sb) {
                    Poll::Ready(Ok(())) if sb.filled().is_empty() => return Poll::Ready(Ok(())),
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Err(e)) = &r {
            this.act.io_error(e);
        }
        if buf.filled().len() > before {
            let phase = this.act.phase();
            if phase == IDLE {
                this.head = HeadScan::default();
                this.act.set(HEAD);
            }
            if phase != REQUEST
                && let Some(status) = this.head.take(&buf.filled()[before..])
            {
                buf.set_filled(before);
                this.refuse(status);
                return Pin::new(this).poll_read(cx, buf);
            }
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        match &r {
            Poll::Pending => self.act.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.act.wrote(),
            Poll::Ready(Err(e)) => self.act.io_error(e),
            Poll::Ready(_) => {}
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        match &r {
            Poll::Pending => self.act.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.act.wrote(),
            Poll::Ready(Err(e)) => self.act.io_error(e),
            Poll::Ready(_) => {}
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that notes when it has arrived whole (its end, or an error), so that a
/// shutdown closes a half-sent request at once instead of waiting for its body.
struct TrackedBody {
    inner: Incoming,
    act: Arc<Activity>,
}

impl TrackedBody {
    fn new(inner: Incoming, act: Arc<Activity>) -> Self {
        act.body_pending
            .store(!hyper::body::Body::is_end_stream(&inner), Ordering::SeqCst);
        TrackedBody { inner, act }
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &r {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => hyper::body::Body::is_end_stream(&self.inner),
            Poll::Pending => false,
        };
        if ended {
            self.act.body_pending.store(false, Ordering::SeqCst);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// What answers while `serve` waits for Redis at start-up: `/healthz` 200 (the process is
/// alive), `/readyz` and everything else 503 `starting` (in the envelope).
pub fn starting_router() -> Router {
    use axum::Json;
    use axum::http::StatusCode;
    use axum::routing::get;
    let starting = || async {
        super::ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            "delayq is starting: waiting for redis",
        )
    };
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(starting))
        .fallback(starting)
}

/// Serves one connection under its watchdog; the permit is its place among the cap.
async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    router: Router,
    limits: Arc<HttpLimits>,
    cancel: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let act = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        act: act.clone(),
        head: HeadScan::default(),
    });
    let tower = TowerToHyperService::new(router);
    let svc_act = act.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut req = req.map(|b| TrackedBody::new(b, svc_act.clone()));
        svc_act.set(REQUEST);
        // The peer address, for the per-client limits of authentication failures.
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let fut = hyper::service::Service::call(&tower, req);
        let a = svc_act.clone();
        async move {
            let r = fut.await;
            a.set(IDLE);
            r
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .max_buf_size(MAX_HEAD_BUFFER)
        .max_headers(HYPER_MAX_HEADERS)
        .keep_alive(true);
    let conn = builder.serve_connection(io, svc);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = false;
    loop {
        let deadline = act.deadline(&limits);
        tokio::select! {
            r = conn.as_mut() => {
                if act.timed_out.load(Ordering::SeqCst) {
                    // The kernel gave up on a client that took no byte for write_timeout
                    // (hyper, idle, takes the error for the end of the connection).
                    tracing::debug!(deadline = "write", "closing an HTTP connection past its deadline");
                    crate::engine::telemetry::http_connection_cut("write");
                } else if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = act.changed.notified() => {}
            _ = tokio::time::sleep_until(deadline.map_or_else(Instant::now, |d| d.0)), if deadline.is_some() => {
                if let Some((d, why)) = act.deadline(&limits) && d <= Instant::now() {
                    tracing::debug!(deadline = why, "closing an HTTP connection past its deadline");
                    crate::engine::telemetry::http_connection_cut(why);
                    return;
                }
            }
            _ = cancel.cancelled(), if !stopping => {
                stopping = true;
                if act.phase() != REQUEST || act.body_pending.load(Ordering::SeqCst) {
                    return; // idle, or a head or body half-sent: closed at once
                }
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
