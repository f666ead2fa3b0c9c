#!/usr/bin/env python3
"""A tiny webhook receiver for delayq's webhook handler (Python standard library only).

Verifies the Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature:
`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`) with WEBHOOK_SECRET, refuses
timestamps more than five minutes off, answers 200 and prints one JSON line per accepted
delivery: {"order": id, "queue", "group", "attempt", "due_at_ms", "idempotency_key"}.
A bad or missing signature is answered 401 (delayq retries, then dead-letters it).

In compose.yaml it is the `webhook` service; CI runs the same file on the host. For real
services use the official `standardwebhooks` library of your language instead.

    WEBHOOK_SECRET=whsec_... python3 webhook-receiver.py [--bind 0.0.0.0] [--port 9000]
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_S = 300
_print_lock = threading.Lock()


def keys_of(secret: str) -> list:
    """The HMAC keys: `whsec_<base64>` decodes; any other text is the key as is."""
    keys = []
    for s in secret.split():
        keys.append(base64.b64decode(s[len("whsec_"):]) if s.startswith("whsec_") else s.encode())
    return keys


def verify(keys: list, headers, body: bytes) -> str:
    """'' when the signature is good, else why not."""
    msg_id = headers.get("webhook-id")
    ts = headers.get("webhook-timestamp")
    sigs = headers.get("webhook-signature")
    if not (msg_id and ts and sigs):
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        if abs(time.time() - int(ts)) > TOLERANCE_S:
            return "timestamp too old or too new"
    except ValueError:
        return "bad timestamp"
    signed = f"{msg_id}.{ts}.".encode() + body
    for key in keys:
        want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for sig in sigs.split():
            version, _, value = sig.partition(",")
            if version == "v1" and hmac.compare_digest(value, want):
                return ""
    return "no signature matches"


class Receiver(BaseHTTPRequestHandler):
    keys: list = []
    delay_s: float = 0.0
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(200, "ok\n")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.keys:
            why = verify(self.keys, self.headers, body)
            if why:
                self._log({"refused": why, "path": self.path})
                self._answer(401, why + "\n")
                return
        try:
            event = json.loads(body)
        except ValueError:
            self._answer(400, "not JSON\n")
            return
        if self.delay_s:
            time.sleep(self.delay_s)
        self._log({
            "order": event.get("id"),
            "queue": event.get("queue"),
            "group": event.get("group"),
            "attempt": event.get("attempt"),
            "due_at_ms": event.get("due_at_ms"),
            "signed": bool(self.keys),
            "idempotency_key": self.headers.get("Idempotency-Key"),
        })
        self._answer(200, "ok\n")

    @staticmethod
    def _log(record: dict) -> None:
        with _print_lock:
            print(json.dumps(record), flush=True)

    def log_message(self, *args) -> None:  # no access log: one JSON line per delivery
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--delay-ms", type=int, default=0, help="answer each delivery this late")
    args = p.parse_args()
    secret = os.environ.get("WEBHOOK_SECRET", "")
    Receiver.keys = keys_of(secret) if secret else []
    Receiver.delay_s = args.delay_ms / 1000
    server = ThreadingHTTPServer((args.bind, args.port), Receiver)
    server.daemon_threads = True
    print(json.dumps({"listening": f"{args.bind}:{args.port}", "verifying": bool(secret)}),
          file=sys.stderr, flush=True)
    # PID 1 in a container: SIGTERM (docker stop) must end it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
