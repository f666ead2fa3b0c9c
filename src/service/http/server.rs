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
//!   router's own deadlines (`read_body`). A slowloris is cut off, never kept.
//! - **Shutdown is bounded.** Once cancelled the loop stops accepting; idle and half-sent
//!   connections are closed at once, running requests finish (then their connections close),
//!   and whatever is left after the grace period is cut off.

use super::HttpLimits;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest request head hyper buffers (beyond it hyper answers 431 itself, without the
/// envelope, and targets over 64 KiB get its bare 414); heads within it but over the
/// router's limits (8 KiB targets, 16 KiB and 100 headers) get the envelope: a 60 KB target
/// is 414 and 400 headers are 431, in JSON.
const MAX_HEAD_BUFFER: usize = 64 * 1024;
/// Most headers hyper parses (beyond, its own bare 431); the router refuses above 100.
const HYPER_MAX_HEADERS: usize = 512;

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
    /// Woken on every phase change, so the watchdog sleeps until the right deadline.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            epoch: Instant::now(),
            phase: AtomicU8::new(IDLE),
            since_ms: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn set(&self, phase: u8) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.since_ms.store(ms, Ordering::SeqCst);
        self.phase.store(phase, Ordering::SeqCst);
        self.changed.notify_one();
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    /// When the current phase runs out (`None`: a request is running; the router bounds it).
    fn deadline(&self, l: &HttpLimits) -> Option<Instant> {
        let since = self.epoch + Duration::from_millis(self.since_ms.load(Ordering::SeqCst));
        match self.phase() {
            IDLE => Some(since + l.idle_timeout),
            HEAD => Some(since + l.header_timeout),
            _ => None,
        }
    }
}

/// A connection's socket, noting when the first bytes of a request arrive.
struct Tracked {
    inner: TcpStream,
    act: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before && self.act.phase() == IDLE {
            self.act.set(HEAD);
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
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
    });
    let tower = TowerToHyperService::new(router);
    let svc_act = act.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
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
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = act.changed.notified() => {}
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if act.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(phase = act.phase(), "closing an HTTP connection past its deadline");
                    return;
                }
            }
            _ = cancel.cancelled(), if !stopping => {
                stopping = true;
                if act.phase() != REQUEST {
                    return; // idle or half-sent: closed at once
                }
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
