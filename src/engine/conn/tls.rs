//! TLS files (a CA, a client certificate and its key): read, checked and carried in the URL.

use super::url::{UrlParts, percent_encode};
use crate::engine::error::InvalidInput;
use redis::{ClientTlsConfig, TlsCertificates};
use std::path::{Path, PathBuf};

/// TLS files for `rediss` connections: a CA to trust instead of the system's roots, and a
/// client certificate with its key (mutual TLS). Paths may appear in logs and errors; the
/// files' contents never do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// A PEM file of the CA certificate(s) that signed the server's certificate (trusted
    /// instead of the system's roots).
    pub ca: Option<PathBuf>,
    /// A PEM file of the client certificate (chain), for servers that require one
    /// (`tls-auth-clients yes`); needs [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// A PEM file of the client certificate's private key.
    pub key: Option<PathBuf>,
}

/// One of the [`TlsFiles`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// The CA file.
    Ca,
    /// The client certificate.
    Cert,
    /// The client certificate's key.
    Key,
}

impl TlsFile {
    /// Its URL query parameter: `tls_ca`, `tls_cert` or `tls_key`.
    pub fn param(self) -> &'static str {
        match self {
            TlsFile::Ca => "tls_ca",
            TlsFile::Cert => "tls_cert",
            TlsFile::Key => "tls_key",
        }
    }
}

/// A TLS file that cannot be used: which one, and why (its path, never its contents).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.param())]
pub struct TlsFileError {
    /// The file at fault.
    pub file: TlsFile,
    /// What is wrong with it.
    pub reason: String,
}

impl TlsFiles {
    /// No files: the system's roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA(s) of the PEM file at `path` instead of the system's roots.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Presents the client certificate at `cert` (PEM) with its private key at `key`.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// True when no file is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The file at `which`.
    pub fn get(&self, which: TlsFile) -> Option<&Path> {
        match which {
            TlsFile::Ca => self.ca.as_deref(),
            TlsFile::Cert => self.cert.as_deref(),
            TlsFile::Key => self.key.as_deref(),
        }
    }

    pub(super) fn slot(&mut self, which: TlsFile) -> &mut Option<PathBuf> {
        match which {
            TlsFile::Ca => &mut self.ca,
            TlsFile::Cert => &mut self.cert,
            TlsFile::Key => &mut self.key,
        }
    }

    /// Checks what needs no file access: a client certificate comes with its key.
    pub fn check_pairing(&self) -> Result<(), TlsFileError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(TlsFileError {
                file: TlsFile::Key,
                reason: "a client certificate (tls_cert) needs its private key too".into(),
            }),
            (None, Some(_)) => Err(TlsFileError {
                file: TlsFile::Cert,
                reason: "a private key (tls_key) needs its client certificate too".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Reads and checks every file: the certificates the redis crate takes, or `None` when
    /// no file is set.
    pub fn load(&self) -> Result<Option<TlsCertificates>, TlsFileError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.check_pairing()?;
        let read = |which: TlsFile, marker: &str, what: &str| -> Result<_, TlsFileError> {
            let Some(path) = self.get(which) else {
                return Ok(None);
            };
            let err = |reason: String| TlsFileError {
                file: which,
                reason,
            };
            let bytes = std::fs::read(path)
                .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
            if !String::from_utf8_lossy(&bytes).contains(marker) {
                return Err(err(format!("{} is not a PEM {what}", path.display())));
            }
            Ok(Some(bytes))
        };
        let ca = read(TlsFile::Ca, "-----BEGIN CERTIFICATE-----", "certificate")?;
        let cert = read(TlsFile::Cert, "-----BEGIN CERTIFICATE-----", "certificate")?;
        let key = read(TlsFile::Key, "PRIVATE KEY-----", "private key")?;
        // Let the redis crate parse each part, so a bad file is named.
        if let Some(ca) = &ca {
            parse_check(TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            })
            .map_err(|reason| TlsFileError {
                file: TlsFile::Ca,
                reason,
            })?;
        }
        let client_tls = match (cert, key) {
            (Some(client_cert), Some(client_key)) => {
                let c = ClientTlsConfig {
                    client_cert,
                    client_key,
                };
                parse_check(TlsCertificates {
                    client_tls: Some(c.clone()),
                    root_cert: None,
                })
                .map_err(|reason| TlsFileError {
                    file: TlsFile::Cert,
                    reason,
                })?;
                Some(c)
            }
            _ => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert: ca,
        }))
    }

    /// These files with `other`'s added; a file set in both must be the same path.
    pub(super) fn merge(mut self, other: &TlsFiles) -> Result<TlsFiles, String> {
        for which in [TlsFile::Ca, TlsFile::Cert, TlsFile::Key] {
            let Some(theirs) = other.get(which) else {
                continue;
            };
            match self.get(which) {
                Some(mine) if mine != theirs => {
                    return Err(format!(
                        "{} is given twice ({} and {})",
                        which.param(),
                        mine.display(),
                        theirs.display()
                    ));
                }
                _ => *self.slot(which) = Some(theirs.to_path_buf()),
            }
        }
        Ok(self)
    }

    /// The names of the files set (`tls_ca, tls_cert`), for messages.
    pub(super) fn names(&self) -> String {
        [TlsFile::Ca, TlsFile::Cert, TlsFile::Key]
            .into_iter()
            .filter(|w| self.get(*w).is_some())
            .map(TlsFile::param)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses certificates the way a connection will (no network).
pub(super) fn parse_check(certs: TlsCertificates) -> Result<(), String> {
    redis::Client::build_with_tls("rediss://localhost:6379", certs)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `url` with `files` added as its `tls_ca` / `tls_cert` / `tls_key` query parameters
/// (what the command line's flags and `serve`'s keys do). Only a `rediss` URL takes them; a
/// file the URL already names must be the same path (then it is not added again).
pub fn url_with_tls_files(url: &str, files: &TlsFiles) -> Result<String, InvalidInput> {
    let bad = |reason: String| InvalidInput::RedisUrl { reason };
    if files.is_empty() {
        return Ok(url.to_owned());
    }
    let parts = UrlParts::parse(url).map_err(bad)?;
    if !parts.is_tls() {
        return Err(bad(format!(
            "TLS files ({}) need a rediss:// URL (rediss+cluster://, rediss+sentinel://), not \
             {}://",
            files.names(),
            parts.scheme
        )));
    }
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let mut out = before_fragment.to_owned();
    for which in [TlsFile::Ca, TlsFile::Cert, TlsFile::Key] {
        let Some(path) = files.get(which) else {
            continue;
        };
        match parts.tls.get(which) {
            Some(named) if named == path => continue,
            Some(named) => {
                return Err(bad(format!(
                    "{} is given twice ({} in the URL, {} besides it)",
                    which.param(),
                    named.display(),
                    path.display()
                )));
            }
            None => {}
        }
        let path = path.to_str().ok_or_else(|| {
            bad(format!(
                "{}: the path {} is not UTF-8",
                which.param(),
                path.display()
            ))
        })?;
        out.push(if out.contains('?') { '&' } else { '?' });
        out.push_str(which.param());
        out.push('=');
        out.push_str(&percent_encode(path));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok(out)
}

/// True when `url` is a TLS URL (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`,
/// `valkeys://`): the only ones that take TLS files.
pub fn is_tls_url(url: &str) -> bool {
    UrlParts::parse(url).is_ok_and(|p| p.is_tls())
}

// ---------------------------------------------------------------------------------------
// URL parsing

/// Resolves when `host:port` answers a plain-text `PING` in RESP (`+PONG`, `-NOAUTH ...`)
/// within `within`: a plain-text Redis port given a `rediss://` URL. Such a server stays
/// silent to a TLS handshake (it waits for the end of a command line), which would
/// otherwise end only in a timeout after every retry. Never resolves otherwise: a TLS port
/// refuses the plain bytes (at its `verbose` log level only), and no answer or an error is
/// left to the TLS connection's own outcome. Run beside the TLS connect, it costs that
/// connect nothing.
pub(super) async fn answers_plain_text(host: &str, port: u16, within: std::time::Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        let n = s.read(&mut first).await.ok()?;
        (n == 1 && matches!(first[0], b'+' | b'-')).then_some(())
    };
    if let Ok(Some(())) = tokio::time::timeout(within, probe).await {
        return;
    }
    std::future::pending::<()>().await
}

/// The error of a `rediss://` URL at a plain-text port (see [`answers_plain_text`]): not
/// retried, as a certificate error is not.
pub(super) fn plain_text_port(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "TLS handshake failed",
        format!(
            "{what} answers in plain text, not TLS: use a redis:// URL for this port, or the \
             server's tls-port with rediss://"
        ),
    ))
}
