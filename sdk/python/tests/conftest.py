"""Test support: throwaway redis-server processes on free ports, the delayq binary, a
webhook receiver, and bounded waits. Nothing here touches a Redis the tests did not start."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import queue as _queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import redis

import delayq

SDK_DIR = Path(__file__).resolve().parents[1]
REPO = SDK_DIR.parents[1]
BIN = os.environ.get("DELAYQ_BIN") or str(REPO / "target" / "debug" / "delayq")
#: The longest any test waits for an event.
WAIT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what: str, fn: Callable[[], Any], within: float = WAIT) -> Any:
    """Calls ``fn`` until it returns something truthy, at most ``within`` seconds."""
    deadline = time.monotonic() + within
    delay = 0.005
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class RedisServer:
    """A redis-server of the test's own: temp dir, free port, no persistence."""

    def __init__(self, *extra: str):
        self.dir = tempfile.mkdtemp(prefix="delayq-py-redis-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "redis.log")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", self.log, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}"
        self.client = redis.Redis(port=self.port, socket_timeout=30)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited: {open(self.log).read()[-2000:]}")
            try:
                return bool(self.client.ping())
            except redis.ConnectionError:
                return False

        poll("redis-server to answer PING", ready)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            self.proc.kill()
            self.proc.wait(timeout=WAIT)
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    s = RedisServer()
    yield s
    s.stop()


@pytest.fixture
def ns() -> str:
    """A namespace of the test's own, so tests sharing one server never meet."""
    return "t" + uuid.uuid4().hex[:12]


def run_bin(*args: str, url: Optional[str] = None, namespace: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [BIN]
    if url:
        cmd += ["--redis-url", url]
    if namespace:
        cmd += ["--namespace", namespace]
    cmd += list(args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
    return p


def create_queue(url: str, namespace: str, queue: str, shards: int = 1) -> None:
    """Registers a queue the way a deployment does: ``delayq queue create``."""
    run_bin("queue", "create", queue, "--shards", str(shards), url=url, namespace=namespace)


@pytest.fixture(scope="session", autouse=True)
def delayq_bin():
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"the delayq binary is needed at {BIN} (set DELAYQ_BIN, or cargo build)")
    return BIN


class AsyncFacade:
    """An :class:`delayq.AsyncClient` behind the sync client's methods, each call awaited on
    one event loop of its own, so every scenario runs against both clients."""

    def __init__(self, url: str, **opts: Any):
        self.loop = asyncio.new_event_loop()
        try:
            self.inner = self.loop.run_until_complete(delayq.AsyncClient.connect(url, **opts))
        except BaseException:
            self.loop.close()
            raise

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def schedule(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.schedule(*a, **k))

    def schedule_many(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.schedule_many(*a, **k))

    def cancel(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.cancel(*a, **k))

    def reschedule(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.reschedule(*a, **k))

    def post_event(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.post_event(*a, **k))

    def cancel_tag(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.cancel_tag(*a, **k))

    def get(self, *a: Any, **k: Any) -> Any:
        return self._run(self.inner.get(*a, **k))

    def now_ms(self) -> int:
        return self.inner.now_ms()

    def with_durability(self, d: Any) -> "AsyncFacade":
        other = object.__new__(AsyncFacade)
        other.loop = self.loop
        other.inner = self.inner.with_durability(d)
        return other

    def close(self) -> None:
        self._run(self.inner.close())
        self.loop.close()


@pytest.fixture(params=["sync", "asyncio"])
def make_client(request):
    """``make_client(url, **options)``: a sync :class:`delayq.Client` or the asyncio one
    behind the same methods; closed after the test."""
    made: List[Any] = []

    def make(url: str, **opts: Any) -> Any:
        c = delayq.Client(url, **opts) if request.param == "sync" else AsyncFacade(url, **opts)
        made.append(c)
        return c

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for c in made:
        c.close()


class Webhook:
    """A tiny HTTP server recording every POST body (the webhook receiver)."""

    def __init__(self) -> None:
        self.calls: "_queue.Queue[Dict[str, Any]]" = _queue.Queue()
        received = self.calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(n)
                received.put({"path": self.path, "body": body, "json": json.loads(body)})
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def next(self, within: float = WAIT) -> Dict[str, Any]:
        try:
            return self.calls.get(timeout=within)
        except _queue.Empty:
            raise AssertionError(f"no webhook call within {within} s") from None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Serve:
    """``delayq serve --config FILE`` as a process of the test's own."""

    def __init__(self, redis_url: str, namespace: str, queue: str, hook_url: Optional[str], shards: int = 1,
                 tokens: "tuple[str, ...]" = ()):
        """With ``hook_url``, the group ``hook`` of ``queue`` is a webhook; with ``tokens``,
        ``/v1/...`` wants one of them (``base_url``: this server's address)."""
        self.dir = tempfile.mkdtemp(prefix="delayq-py-serve-")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(self.dir, "delayq.toml")
        with open(cfg, "w") as f:
            f.write(
                f'redis_url = "{redis_url}"\nnamespace = "{namespace}"\nshards = {shards}\n'
                f'[http]\nlisten = "127.0.0.1:{self.port}"\ntokens = {json.dumps(list(tokens))}\n'
            )
            if hook_url:
                f.write(f'[[handlers]]\nqueue = "{queue}"\ngroup = "hook"\nkind = "webhook"\nurl = "{hook_url}"\n')
        self.log_path = os.path.join(self.dir, "serve.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
        env["RUST_LOG"] = "info"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([BIN, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log, env=env)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log()[-3000:]}")
            return self.http("GET", "/healthz")[0] == 200

        poll("delayq serve to answer /healthz", ready)

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def http(self, method: str, path: str) -> "tuple[int, bytes]":
        import http.client

        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request(method, path)
            r = conn.getresponse()
            out = (r.status, r.read())
            conn.close()
            return out
        except OSError:
            return (0, b"")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
