"""delayq: schedule, cancel, reschedule and read order-expiry events from Python.

A producer for delayq that behaves like the Rust
``Client``: the same Redis keys, the same Lua scripts (vendored byte for byte), the same
validation rules and the same error codes. Dispatch and delivery are done by the Rust
engine (``delayq serve``).

    import delayq
    client = delayq.Client("redis://127.0.0.1:6379")
    client.schedule("order-close", "order-1234", delay_ms=15 * 60_000, payload={"user": 42})
    client.schedule("order-close", "order-vip", delay_ms=15 * 60_000, priority="high")
    client.cancel("order-close", "order-1234")

Orders can also be consumed here, over the HTTP pull API of ``delayq serve``:
:class:`Consumer` and :class:`AsyncConsumer` (receive, ack, nack, extend, run).
"""

from ._core import (
    CancelOutcome,
    Debounce,
    Durability,
    Leader,
    Mode,
    Order,
    Outcome,
    Priority,
    Replicated,
    RescheduleOutcome,
    Scheduled,
    ScheduledOrder,
)
from .aio import AsyncClient
from .client import Client
from .consumer import AsyncConsumer, Consumer, Delivery, RunReport
from .errors import (
    ApiError,
    ApiUnreachable,
    DelayqError,
    InvalidInput,
    LeaseLost,
    NotReplicated,
    PartialBatch,
    QueueNotFound,
    RedisFailure,
)
from .rules import RawJson, shard_of

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "ApiUnreachable",
    "AsyncClient",
    "AsyncConsumer",
    "CancelOutcome",
    "Debounce",
    "Client",
    "Consumer",
    "DelayqError",
    "Delivery",
    "Durability",
    "InvalidInput",
    "Leader",
    "LeaseLost",
    "Mode",
    "NotReplicated",
    "Order",
    "Outcome",
    "PartialBatch",
    "Priority",
    "QueueNotFound",
    "RawJson",
    "RedisFailure",
    "Replicated",
    "RescheduleOutcome",
    "RunReport",
    "Scheduled",
    "ScheduledOrder",
    "shard_of",
    "__version__",
]
