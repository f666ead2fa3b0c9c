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
from .errors import (
    DelayqError,
    InvalidInput,
    NotReplicated,
    PartialBatch,
    QueueNotFound,
    RedisFailure,
)
from .rules import RawJson, shard_of

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "CancelOutcome",
    "Debounce",
    "Client",
    "DelayqError",
    "Durability",
    "InvalidInput",
    "Leader",
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
    "Scheduled",
    "ScheduledOrder",
    "shard_of",
    "__version__",
]
