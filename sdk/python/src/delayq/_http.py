"""The pull consumers' HTTP transport: one kept-alive connection per thread.

A new connection per call (``urllib.request.urlopen``) costs a TCP (and TLS) handshake per
receive, ack, nack and extend, and leaves a socket in ``TIME_WAIT`` behind each one; a busy
consumer then runs out of local ports. Here each thread keeps its connection open between
calls. Before a kept connection is reused it is checked for a close by the server (an idle
timeout): a closed one is replaced, so a call is never sent into a dead socket. Through an
HTTP(S) proxy from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``
respected as ``urllib`` does) calls go through ``urllib`` as before, one connection each.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, Optional, Tuple

from .errors import ApiError, ApiUnreachable, LeaseLost


def _proxied(parts: urllib.parse.SplitResult) -> bool:
    """Whether ``urllib`` would send a call to this URL through a proxy."""
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def _closed(sock: Optional[socket.socket]) -> bool:
    """Whether the server closed a kept connection (its socket reads as ready: an EOF, or
    bytes nobody asked for, which makes it unusable too)."""
    if sock is None:
        return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


class Transport:
    """POSTs JSON bodies under one base URL, with ``Authorization: Bearer`` when a token is
    given; every call bounded by ``timeout`` seconds plus its own wait. Thread-safe: each
    thread has its own connection."""

    def __init__(self, base_url: str, token: Optional[str], timeout: float):
        parts = urllib.parse.urlsplit(base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._base_path = parts.path.rstrip("/")
        self._base_url = base_url.rstrip("/")
        self._direct = not _proxied(parts)
        self._timeout = timeout
        self.__token = token
        self._local = threading.local()
        self._tls = ssl.create_default_context() if self._https else None

    def _headers(self) -> Dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.__token:
            h["Authorization"] = f"Bearer {self.__token}"
        return h

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """This thread's connection: the kept one unless the server closed it."""
        c: Optional[http.client.HTTPConnection] = getattr(self._local, "conn", None)
        if c is not None and _closed(c.sock):
            c.close()
            c = None
        if c is None:
            if self._https:
                c = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._tls)
            else:
                c = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._local.conn = c
        elif c.sock is not None:
            c.sock.settimeout(timeout)
        c.timeout = timeout
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
        self._local.conn = None

    def close(self) -> None:
        """Closes the calling thread's connection (the others close with their threads)."""
        self._drop()

    def post(self, path: str, body: object, what: str, wait: float = 0.0) -> str:
        """POSTs ``body`` (as JSON) to ``path`` under the base URL: the answer's text, or
        :class:`ApiError` (:class:`LeaseLost` for 409 ``lease_lost``) for an error answer,
        :class:`ApiUnreachable` when no answer came."""
        data = json.dumps(body).encode()
        timeout = self._timeout + wait
        if self._direct:
            status, reason, text = self._post_kept(path, data, what, timeout)
        else:
            status, reason, text = self._post_urllib(path, data, what, timeout)
        if status < 400:
            return text
        try:
            env = json.loads(text)["error"]
            code, message = str(env["code"]), str(env["message"])
        except (ValueError, KeyError, TypeError):
            code, message = ("internal" if status >= 500 else "invalid_request"), reason
        cls = LeaseLost if (status, code) == (409, "lease_lost") else ApiError
        raise cls(what, status, code, message)

    def _post_kept(self, path: str, data: bytes, what: str, timeout: float) -> Tuple[int, str, str]:
        c = self._connection(timeout)
        try:
            c.request("POST", self._base_path + path, body=data, headers=self._headers())
            r = c.getresponse()
            text = r.read().decode("utf-8", "replace")
        except (http.client.HTTPException, socket.timeout, ConnectionError, OSError) as e:
            self._drop()
            raise ApiUnreachable(what, e, sent=not isinstance(e, ConnectionRefusedError)) from None
        if r.will_close:
            self._drop()
        return r.status, r.reason, text

    def _post_urllib(self, path: str, data: bytes, what: str, timeout: float) -> Tuple[int, str, str]:
        req = urllib.request.Request(self._base_url + path, data=data, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, str(r.reason), r.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            try:
                text = e.read().decode("utf-8", "replace")
            except OSError:
                text = ""
            finally:
                e.close()
            return e.code, str(e.reason), text
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as e:
            cause = e.reason if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException) else e
            raise ApiUnreachable(what, cause, sent=not isinstance(cause, ConnectionRefusedError)) from None
