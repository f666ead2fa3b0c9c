"""The sync pull consumer's shared acks: handlers that finish while an ``:ack`` call is in
flight have their deliveries acknowledged together by the next call (up to 100 per call),
instead of one call each. Nothing waits on purpose: a lone ack goes at once; the batching
comes from acks arriving while another is being sent. The thread that finds no call in
flight sends one (the first ``MOST`` queued, its own among them once its turn comes); the
others wait for their answer (see ``Consumer.run``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, List, Optional

from .errors import LeaseLost

if TYPE_CHECKING:
    from .consumer import Consumer, Delivery

#: Most deliveries one ``:ack`` call carries (the server's own bound on a call).
MOST = 100


class _Item:
    __slots__ = ("d", "status", "error")

    def __init__(self, d: "Delivery"):
        self.d = d
        self.status: Optional[str] = None
        self.error: Optional[BaseException] = None


class AckBatch:
    """Acks deliveries for ``Consumer.run``'s handler threads, sharing calls."""

    def __init__(self, consumer: "Consumer"):
        self._consumer = consumer
        self._cv = threading.Condition()
        self._queued: List[_Item] = []
        self._sending = False

    def ack(self, d: "Delivery") -> str:
        """Acknowledges ``d``: ``"acked"`` or ``"lease_lost"``; raises what the call raised
        (the delivery's lease then runs out and it comes back)."""
        item = _Item(d)
        with self._cv:
            self._queued.append(item)
            while item.status is None and item.error is None:
                if self._sending:
                    self._cv.wait()
                    continue
                self._sending = True
                batch = self._queued[:MOST]
                del self._queued[:MOST]
                self._cv.release()
                try:
                    self._send(batch)
                finally:
                    self._cv.acquire()
                    self._sending = False
                    self._cv.notify_all()
        if item.error is not None:
            raise item.error
        return item.status or "lease_lost"

    def _send(self, batch: List[_Item]) -> None:
        try:
            statuses = self._consumer.ack([i.d for i in batch])
        except LeaseLost:
            statuses = ["lease_lost"] * len(batch)
        except BaseException as e:  # every item of the call gets the failure
            for i in batch:
                i.error = e
            return
        for i, st in zip(batch, statuses):
            i.status = st
        for i in batch[len(statuses):]:  # an answer short of results: never wait forever
            i.error = RuntimeError("the :ack answer has fewer results than receipts")
