//! `delayq healthcheck [--config FILE] [--ready] [--timeout 3s]`: asks the local `delayq
//! serve` for `/healthz` (the process is up) or `/readyz` (it reaches Redis) and exits 0 on
//! a 200 answer, 1 on anything else (no answer, a refused connection, a timeout, another
//! status, a configuration it cannot read), printing one line either way. It is the image's
//! `HEALTHCHECK` and the command of exec probes: no HTTP client needs to be in the image.
//!
//! The address is `serve`'s: `http.listen` read from the same file and the same
//! `DELAYQ_<KEY>` environment overrides (`DELAYQ_HTTP__LISTEN`), through the same loader
//! ([`crate::service::config::listen_of`]); an unspecified address (`0.0.0.0`, `[::]`)
//! is asked on the loopback of its family. Exit 1 (never 2) for every failure, since
//! container runtimes reserve exit 2 in health checks.

use super::{Failure, VerbResult};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most of the answer read: the status line and enough of the body to say why.
const MAX_ANSWER: usize = 4096;

/// Runs the verb.
pub(super) async fn run(config: Option<&Path>, ready: bool, timeout: &str) -> VerbResult {
    let path = if ready { "/readyz" } else { "/healthz" };
    let name = &path[1..];
    let timeout = crate::engine::duration::parse_duration("--timeout", timeout)
        .map_err(|e| Failure::NotFound(format!("{name}: {e}")))?;
    if timeout.is_zero() {
        return Err(Failure::NotFound(format!(
            "{name}: --timeout must be more than 0s"
        )));
    }
    let listen = crate::service::config::listen_of(config)
        .map_err(|e| Failure::NotFound(format!("{name}: {e}")))?;
    let addr = probe_address(listen);
    match tokio::time::timeout(timeout, ask(addr, path)).await {
        Ok(Ok((200, _))) => {
            outln!("{name}: 200 from {addr}");
            Ok(())
        }
        Ok(Ok((status, why))) => Err(Failure::NotFound(format!(
            "{name}: {status} from {addr}{}",
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            }
        ))),
        Ok(Err(e)) => Err(Failure::NotFound(format!("{name}: {addr}: {e}"))),
        Err(_) => Err(Failure::NotFound(format!(
            "{name}: {addr}: no answer within {}",
            crate::engine::duration::format_duration(timeout)
        ))),
    }
}

/// Where to ask: the listen address, with an unspecified IP replaced by the loopback of its
/// family.
fn probe_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// `GET path` over HTTP/1.1: the status code and, for a failure, the error code of delayq's
/// envelope (or the start of the body), on one line.
async fn ask(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("cannot send: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while buf.len() < MAX_ANSWER {
        match s.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if buf.is_empty() => return Err(format!("cannot read: {e}")),
            Err(_) => break,
        }
    }
    parse_answer(&buf)
}

/// The status code of an HTTP/1.x answer and, when it is not 200, why (one line).
fn parse_answer(buf: &[u8]) -> Result<(u16, String), String> {
    let text = String::from_utf8_lossy(buf);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let status = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code
            .parse::<u16>()
            .map_err(|_| format!("not an HTTP answer: {:?}", clip(status_line)))?,
        _ if text.is_empty() => return Err("closed without an answer".into()),
        _ => return Err(format!("not an HTTP answer: {:?}", clip(status_line))),
    };
    if status == 200 {
        return Ok((status, String::new()));
    }
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let why = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/code")
                .and_then(|c| c.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| clip(body));
    Ok((status, why))
}

/// At most 120 characters of `s`, on one line.
fn clip(s: &str) -> String {
    let one: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(120)
        .collect();
    one.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_address_is_asked_on_the_loopback() {
        let a = probe_address("0.0.0.0:7070".parse().unwrap());
        assert_eq!(a, "127.0.0.1:7070".parse().unwrap());
        let a = probe_address("[::]:7071".parse().unwrap());
        assert_eq!(a, "[::1]:7071".parse().unwrap());
        let a = probe_address("10.1.2.3:80".parse().unwrap());
        assert_eq!(a, "10.1.2.3:80".parse().unwrap());
    }

    #[test]
    fn answers_are_read_as_status_and_reason() {
        assert_eq!(
            parse_answer(b"HTTP/1.1 200 OK\r\n\r\n{}").unwrap(),
            (200, String::new())
        );
        let body = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\r\n{\"error\":{\"code\":\"redis_unavailable\",\"message\":\"redis is unavailable\"}}";
        assert_eq!(
            parse_answer(body).unwrap(),
            (503, "redis_unavailable".into())
        );
        assert!(parse_answer(b"").is_err());
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n").is_err());
    }
}
