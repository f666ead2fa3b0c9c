"""The sync pull consumer's lease keeper: the leases of running handlers extended at half
their lease, in one ``extend`` call per tick, on a thread of its own (see
``Consumer.run``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Dict

from .errors import LeaseLost

if TYPE_CHECKING:
    from .consumer import Consumer, Delivery

log = logging.getLogger("delayq.consumer")


class _Held:
    """A delivery whose handler runs: its lease is extended until it is settled."""

    __slots__ = ("d", "lock", "renew_at", "lost")

    def __init__(self, d: "Delivery", renew_at: float):
        self.d = d
        #: Held while the delivery is extended or settled (never both at once: a settle
        #: after an extension uses the new receipt).
        self.lock = threading.Lock()
        self.renew_at = renew_at
        self.lost = False


class _Leases:
    """Extends the leases of running handlers at half their lease, in one ``extend`` call
    per tick (a thread of its own)."""

    def __init__(self, consumer: "Consumer"):
        self.consumer = consumer
        self.half = consumer.lease_ms / 2000.0
        self.tick = min(max(consumer.lease_ms / 8000.0, 0.01), 1.0)
        self.held: "Dict[int, _Held]" = {}
        self.lock = threading.Lock()
        self.end = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="delayq-consumer-leases", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.end.set()
        self.thread.join(timeout=self.consumer.timeout + 1)

    def hold(self, d: "Delivery") -> _Held:
        h = _Held(d, time.monotonic() + self.half)
        with self.lock:
            self.held[id(h)] = h
        return h

    def release(self, h: _Held) -> None:
        with self.lock:
            self.held.pop(id(h), None)

    def _loop(self) -> None:
        while not self.end.wait(self.tick):
            now = time.monotonic()
            with self.lock:
                due = [h for h in self.held.values() if h.renew_at <= now and not h.lost]
            due = [h for h in due if h.lock.acquire(blocking=False)]
            if not due:
                continue
            try:
                try:
                    news = self.consumer.extend([h.d for h in due])
                except LeaseLost:
                    news = [None] * len(due)
                for h, new in zip(due, news):
                    if new is None:
                        h.lost = True
                        self.release(h)
                    else:
                        h.renew_at = time.monotonic() + self.half
            except Exception as e:  # tried again next tick
                log.warning("extending %d leases failed: %s", len(due), e)
            finally:
                for h in due:
                    h.lock.release()
