"""The synchronous producer client (redis-py)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import redis
from redis.cluster import ClusterNode, RedisCluster

from . import _core as c
from . import rules
from .errors import DelayqError, InvalidInput, NotReplicated, QueueNotFound

_DURABLE_TIMEOUT = 70.0  # the longest WAIT (60 s) plus the writes before it


class Client:
    """A producer on one Redis (or one Redis Cluster) and one key namespace.

    Thread-safe: share one per process. ``Client("redis://127.0.0.1:6379")``; for a cluster
    ``Client("redis+cluster://h1:7000,h2:7001")``. Options: ``namespace`` (``dq``),
    ``max_payload_bytes`` (64 KiB), ``durability`` (:class:`Leader` or
    :class:`Replicated`), ``response_timeout`` / ``connect_timeout`` (seconds), ``clock``
    (a callable returning unix ms; default the Redis server's clock).
    """

    def __init__(self, url: str, **options: Any):
        self._opts = c.Options(**options)
        self._opts.validate()
        self._target = c.parse_url(url)
        self._keys = c.Keys(self._opts.namespace)
        self._known: Dict[str, c.QueueRef] = {}
        self._lock = threading.Lock()
        self._clock = c.RedisClock()
        self._r = self._connect(self._opts.response_timeout)
        # Opened on first use, shared with every with_durability() handle, closed by close().
        self._lazy: Dict[str, Any] = {"durable": None, "nodes": {}}
        self.durability: c.Durability = self._opts.durability
        if self._opts.clock is None:
            self._sync_clock()

    # ------------------------------------------------------------ connections

    def _connect(self, timeout: float) -> Any:
        t = self._target
        common = dict(
            socket_timeout=timeout,
            socket_connect_timeout=self._opts.connect_timeout,
            decode_responses=False,
        )
        try:
            if t.is_cluster:
                return RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in t.nodes],
                    username=t.username,
                    password=t.password,
                    ssl=t.ssl,
                    **common,
                )
            return redis.Redis.from_url(t.url, retry=c.no_retry(), **common)
        except (redis.RedisError, OSError) as e:
            raise c.wrap("connecting", e) from None
        except ValueError:
            raise InvalidInput("invalid_redis_url", "invalid redis url: it does not parse") from None

    def _durable_client(self) -> Any:
        with self._lock:
            if self._lazy["durable"] is None:
                self._lazy["durable"] = self._connect(_DURABLE_TIMEOUT)
            return self._lazy["durable"]

    def _node_client(self, host: str, port: int) -> redis.Redis:
        """A plain connection pool to one cluster node (durable pipelines: the WAIT must run
        on the connection that made the writes)."""
        with self._lock:
            cl = self._lazy["nodes"].get((host, port))
            if cl is None:
                t = self._target
                cl = redis.Redis(
                    host=host, port=port, username=t.username, password=t.password, ssl=t.ssl,
                    socket_timeout=_DURABLE_TIMEOUT, socket_connect_timeout=self._opts.connect_timeout,
                    retry=c.no_retry(),
                )
                self._lazy["nodes"][(host, port)] = cl
            return cl

    def close(self) -> None:
        """Closes every connection."""
        for r in [self._r, self._lazy["durable"], *self._lazy["nodes"].values()]:
            if r is not None:
                try:
                    r.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def with_durability(self, d: c.Durability) -> "Client":
        """A handle on the same connections whose schedules have durability ``d``."""
        c.check_durability(d)
        other = object.__new__(Client)
        other.__dict__.update(self.__dict__)
        other.durability = d
        return other

    @property
    def namespace(self) -> str:
        return self._opts.namespace

    @property
    def is_cluster(self) -> bool:
        return self._target.is_cluster

    # ------------------------------------------------------------ clock

    def _sync_clock(self) -> None:
        try:
            self._clock.set(self._r.time())
        except redis.RedisError as e:
            raise c.wrap("reading the Redis clock (TIME)", e) from None

    def now_ms(self) -> int:
        """"Now" in unix ms: the Redis server's clock (or the ``clock`` option)."""
        if self._opts.clock is not None:
            return int(self._opts.clock())
        if self._clock.anchor_ms is None:
            self._sync_clock()
        return self._clock.now_ms()

    def _resync_if_stale(self) -> None:
        # After validation (which never waits on Redis): re-anchor on TIME every 30 s.
        if self._opts.clock is None and self._clock.stale():
            self._sync_clock()

    # ------------------------------------------------------------ registry

    def _lookup(self, queue: str) -> Optional[c.QueueRef]:
        ref = self._known.get(queue)
        if ref is not None:
            return ref
        try:
            shards, epoch, cancel_on = c.read_record(self._r.hmget(self._keys.record(queue), c.RECORD_FIELDS))
        except redis.RedisError as e:
            raise c.wrap("reading the queue registry", e) from None
        if shards is None:
            return None
        if epoch is None:
            ref = self._upgrade_record(queue, shards)
        else:
            ref = c.QueueRef(shards, epoch, cancel_on)
        self._known[queue] = ref
        return ref

    def _upgrade_record(self, queue: str, shards: int) -> c.QueueRef:
        """A record written by an earlier version (no epoch) gets one, and its shards their
        markers, as the Rust client does (create_queue.lua, then HSET on each marker)."""
        k = self._keys
        try:
            reply = self._evalsha(
                c.CREATE_QUEUE, [k.queues(), k.record(queue), k.registry_version()],
                [queue, shards, c.new_epoch(self.now_ms()), self._opts.max_queues],
            )
            ref = c.QueueRef(int(reply[1]), c._text(reply[2]))
            for s in range(ref.shards):
                self._r.hset(k.meta(queue, s), "epoch", ref.epoch)
        except redis.RedisError as e:
            raise c.wrap("registering the queue", e) from None
        return ref

    def _queue_ref(self, queue: str) -> c.QueueRef:
        self._resync_if_stale()
        ref = self._lookup(queue)
        if ref is None:
            raise QueueNotFound(queue)
        return ref

    def _forget(self, queue: str) -> None:
        self._known.pop(queue, None)

    # ------------------------------------------------------------ scripts

    def _evalsha(self, script: c.Script, keys: Sequence[str], args: Sequence[Any], conn: Any = None) -> Any:
        r = conn if conn is not None else self._r
        try:
            return r.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.ResponseError as e:
            if not c.is_noscript(e):
                raise
        self._load(script, r)
        return r.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _load(self, script: c.Script, r: Any) -> None:
        sha = r.script_load(script.text)
        sha = c._text(sha)
        if sha != script.sha:
            raise DelayqError(f"redis computed another SHA1 for {script.name}.lua")

    # ------------------------------------------------------------ producing

    def schedule(
        self,
        queue: str,
        id: str,
        *,
        delay_ms: Optional[int] = None,
        due_ms: Optional[int] = None,
        delay: Optional[_dt.timedelta] = None,
        at: Optional[_dt.datetime] = None,
        payload: Any = None,
        mode: Union[str, c.Mode] = c.Mode.UPSERT,
        priority: Union[str, c.Priority, None] = c.Priority.NORMAL,
        at_local: Optional[str] = None,
        timezone: Optional[str] = None,
        expires_after_ms: Optional[int] = None,
        debounce: Any = None,
        repeat: bool = False,
        tags: Optional[Sequence[str]] = None,
        key: Optional[str] = None,
        cancel_on: Optional[Sequence[Dict[str, Any]]] = None,
    ) -> c.Scheduled:
        """Schedules one order: due after ``delay_ms`` (or ``delay``) or at ``due_ms`` (or
        ``at``), or at the local wall-clock time ``at_local`` (``"2027-03-28T09:00"``, no
        offset) of the IANA zone ``timezone``, resolved once with the recurring schedules'
        rules (a nonexistent time is the end of the gap, a repeated one its first
        occurrence; ``invalid_local_time`` / ``invalid_timezone`` otherwise); the result's
        ``due_at_ms`` is the resolved instant. ``payload``: any JSON value, or :class:`RawJson` text kept byte for byte.
        ``mode``: ``upsert`` (a known id gets the new due time, payload and priority) or
        ``if_absent`` (a known id is left untouched). ``priority``: ``"high"``,
        ``"normal"`` (the default) or ``"low"``; anything else is refused with
        ``invalid_priority`` before anything is sent. ``expires_after_ms``: not handed to a
        consumer group later than this past the due time (1 ..= 10 years of ms, else
        ``invalid_option``); that group dead-letters it with reason ``expired`` instead.
        ``debounce`` (:class:`Debounce` or ``{"delay_ms", "max_wait_ms"}``) instead of a due
        time: due ``delay_ms`` after each call, never later than ``max_wait_ms`` after the
        first. ``repeat``: schedule it even if it was dispatched within the queue's dedup
        window (otherwise the outcome is ``duplicate`` and nothing is written). ``tags``: at
        most 10 strings, each 1..=128 bytes without control characters, none twice (else
        ``invalid_option``); an upsert replaces the set. ``key``: the order's key (1..=128
        bytes, no control characters, else ``invalid_option``): due orders are dispatched
        round robin between keys; an upsert without one removes it. ``cancel_on``: the
        order's own cancel-on-event rules (``[{"event", "match", "remember_ms"}]``, checked as
        a queue's, else ``invalid_option`` naming ``cancel_on``)."""
        order = c.Order(
            id,
            delay_ms=delay_ms,
            due_ms=due_ms,
            payload=payload,
            delay=delay,
            at=at,
            priority=priority,
            at_local=at_local,
            timezone=timezone,
            expires_after_ms=expires_after_ms,
            debounce=debounce,
            repeat=repeat,
            tags=tags,
            key=key,
            cancel_on=cancel_on,
        )
        try:
            return self.schedule_many(queue, [order], mode=mode)[0]
        except InvalidInput as e:
            raise c.single(e) from None

    def _register_order_rules(self, queue: str, prepared: Sequence[Any]) -> None:
        """Registers in the queue's record the rules the orders declare for themselves
        (order_rules.lua; nothing when none does), as the Rust client does."""
        fields = c.order_rule_fields(prepared)
        if not fields:
            return
        try:
            n = int(self._evalsha(c.ORDER_RULES, [self._keys.record(queue)], [rules.MAX_ORDER_RULES] + fields))
        except redis.RedisError as e:
            raise c.wrap("registering the orders' cancel_on rules (order_rules.lua)", e) from None
        if n == -1:
            self._forget(queue)
            raise QueueNotFound(queue)
        if n == -2:
            raise InvalidInput(
                "invalid_option",
                f"invalid option cancel_on: the orders of {queue} already declare {rules.MAX_ORDER_RULES} distinct rules: use the queue's rules, or fewer distinct ones",
            )

    def schedule_many(self, queue: str, orders: Iterable[Union[c.Order, dict]], mode: Union[str, c.Mode] = c.Mode.UPSERT) -> List[c.Scheduled]:
        """Schedules a batch (at most 10,000 orders, each with its own ``priority``),
        validated whole first: one invalid order refuses the batch (``InvalidInput.index``
        names it) and nothing is written.
        Sent as calls of at most 500 orders and 1 MiB, one shard per call, in one pipeline.
        Returns one result per order, in order; a call that failed after others succeeded
        raises :class:`PartialBatch`."""
        orders = list(orders)
        if_absent = c.parse_mode(mode) == c.Mode.IF_ABSENT
        now = self.now_ms()
        prepared = c.prepare_batch(queue, orders, now, self._opts.max_payload_bytes, if_absent)
        ref = self._queue_ref(queue)
        if not prepared:
            return []
        sent = c.with_tokens(prepared, ref)
        # The orders' own rules are made known to events before any order carries them.
        self._register_order_rules(queue, prepared)
        calls = c.plan(ref.shards, sent)
        results = self._enqueue(queue, calls, sent, ref.epoch_arg(), if_absent, now)
        if all(isinstance(r, DelayqError) and getattr(r, "refusal", None) for r in results):
            # Every call refused by enqueue.lua (nothing written): the queue was deleted,
            # or deleted and created again. Re-read the registry once and retry.
            self._forget(queue)
            fresh = self._queue_ref(queue)
            if fresh == ref:
                raise QueueNotFound(queue)
            ref = fresh
            # The rules may have changed: the orders' match tokens are computed again.
            sent = c.with_tokens(prepared, ref)
            calls = c.plan(ref.shards, sent)
            results = self._enqueue(queue, calls, sent, ref.epoch_arg(), if_absent, now)
        out: List[Any] = []
        for r in results:
            if isinstance(r, DelayqError) and getattr(r, "refusal", None):
                self._forget(queue)
                r = QueueNotFound(queue)
            out.append(r)
        return c.assemble(queue, calls, out, sent)

    def _enqueue(self, queue: str, calls: List[c.Call], prepared: List[c.Prepared], epoch: str, if_absent: bool, now: int) -> List[Any]:
        argv = [c.enqueue_args(self._keys, queue, call, prepared, epoch, if_absent, now) for call in calls]
        if isinstance(self.durability, c.Replicated):
            return self._enqueue_replicated(calls, argv, self.durability)
        return self._run_pipeline(self._r, calls, argv)

    def _run_pipeline(self, r: Any, calls: List[c.Call], argv: List[List[Any]]) -> List[Any]:
        """The calls in one pipeline; a NOSCRIPT loads the script and re-sends the refused
        calls (nothing of them was written)."""
        out: List[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for round in range(2):
            pipe = r.pipeline(transaction=False)
            for i in todo:
                pipe.execute_command(*argv[i])
            try:
                replies = pipe.execute(raise_on_error=False)
            except Exception as e:  # noqa: BLE001 - the whole pipeline failed
                err = c.wrap("scheduling orders (enqueue.lua)", e)
                for i in todo:
                    out[i] = err
                return out
            again = []
            for i, rep in zip(todo, replies):
                if isinstance(rep, Exception):
                    if round == 0 and c.is_noscript(rep):
                        again.append(i)
                    else:
                        out[i] = self._call_error(rep)
                else:
                    try:
                        out[i] = c.outcomes(rep, len(calls[i].idxs))
                    except DelayqError as e:
                        out[i] = e
            if not again:
                break
            try:
                self._load(c.ENQUEUE, r)
            except Exception as e:  # noqa: BLE001
                err = c.wrap("loading enqueue.lua", e)
                for i in again:
                    out[i] = err
                break
            todo = again
        return out

    @staticmethod
    def _call_error(e: BaseException) -> DelayqError:
        err = c.wrap("scheduling orders (enqueue.lua)", e)
        err.refusal = c.refusal(e)  # type: ignore[attr-defined]
        return err

    def _enqueue_replicated(self, calls: List[c.Call], argv: List[List[Any]], d: c.Replicated) -> List[Any]:
        """Each node's enqueue calls and a ``WAIT`` after them as one pipeline on one
        connection, never re-sent on another; fewer acks than asked, or a connection lost
        anywhere before WAIT's answer, is :class:`NotReplicated`."""
        groups: Dict[Any, List[int]] = {}
        if self._target.is_cluster:
            rc = self._r
            for i, a in enumerate(argv):
                node = rc.get_node_from_key(a[3])
                groups.setdefault((node.host, node.port), []).append(i)
        else:
            groups[None] = list(range(len(calls)))
        out: List[Any] = [None] * len(calls)
        for node, idxs in groups.items():
            conn = self._durable_client() if node is None else self._node_client(*node)
            for i, r in zip(idxs, self._durable_pipeline(conn, [argv[i] for i in idxs], [len(calls[i].idxs) for i in idxs], d)):
                out[i] = r
        return out

    def _durable_pipeline(self, conn: Any, argv: List[List[Any]], sizes: List[int], d: c.Replicated) -> List[Any]:
        timeout = max(1, min(d.timeout_ms, rules.MAX_WAIT_MS))
        out: List[Any] = [None] * len(argv)
        todo = list(range(len(argv)))
        for round in range(2):
            pipe = conn.pipeline(transaction=False)
            for i in todo:
                pipe.execute_command(*argv[i])
            pipe.execute_command("WAIT", d.replicas, timeout)
            try:
                replies = pipe.execute(raise_on_error=False)
            except Exception:  # noqa: BLE001 - the connection broke between the writes and WAIT's answer
                for i in todo:
                    out[i] = NotReplicated(0, d.replicas, d.timeout_ms)
                break
            acked_reply = replies[-1]
            acked = acked_reply if isinstance(acked_reply, int) else 0
            again = []
            for i, rep in zip(todo, replies[:-1]):
                if isinstance(rep, Exception):
                    if round == 0 and c.is_noscript(rep):
                        again.append(i)
                    else:
                        out[i] = self._call_error(rep)
                    continue
                try:
                    o = c.outcomes(rep, sizes[i])
                except DelayqError as e:
                    out[i] = e
                    continue
                out[i] = o if acked >= d.replicas else NotReplicated(acked, d.replicas, d.timeout_ms)
            if not again:
                break
            try:
                self._load(c.ENQUEUE, conn)
            except Exception as e:  # noqa: BLE001
                err = c.wrap("loading enqueue.lua", e)
                for i in again:
                    out[i] = err
                break
            todo = again
        return [o if o is not None else NotReplicated(0, d.replicas, d.timeout_ms) for o in out]

    # ------------------------------------------------------------ cancel, reschedule, get

    def _shard_keys(self, queue: str, id: str) -> Tuple[str, str, str, str, str, str]:
        """The due ZSET, payload HASH, levels HASH, debounce HASH, key index and key ring of
        the order's shard (get.lua takes the first four, reschedule.lua five, cancel.lua
        these with the tag index and a history bucket: each one KEYS arity)."""
        rules.check_queue(queue)
        idb = rules.check_id(id)
        ref = self._queue_ref(queue)
        s = rules.shard_of(idb, ref.shards)
        return (
            self._keys.due(queue, s),
            self._keys.payload(queue, s),
            self._keys.levels(queue, s),
            self._keys.tag(queue, s) + ":debounce",
            self._keys.tag(queue, s) + ":keyed",
            self._keys.tag(queue, s) + ":key_ring",
        )

    def _retention(self, queue: str) -> Any:
        """The queue's history retention as its record holds it (None: the default)."""
        try:
            return self._r.hget(self._keys.record(queue), c.RETENTION_FIELD)
        except redis.RedisError as e:
            raise c.wrap("reading the history retention", e) from None

    def _cancel_record(self, queue: str, shard_tag: str, retention: Any = False) -> Tuple[str, int, int]:
        """The history bucket, its expiry (0: history off) and now, for a cancellation in
        the shard ``shard_tag`` (``retention`` False: read from the record)."""
        if retention is False:
            retention = self._retention(queue)
        now = self.now_ms()
        bucket, expiry = c.cancel_record(shard_tag, retention, now)
        return bucket, expiry, now

    def cancel(self, queue: str, id: str) -> c.CancelOutcome:
        """Cancels a scheduled order (e.g. the customer paid). ``not_found`` when it was
        never scheduled, was already cancelled, or was already dispatched."""
        keys = self._shard_keys(queue, id)
        try:
            # The tag index as KEYS[5], the key index and ring as KEYS[6], KEYS[7]: a
            # tagged order's tags and a keyed order's member leave them (cancel.lua).
            # The history bucket as KEYS[8] with its expiry and now: the cancellation is
            # recorded in the order history (cancel.lua; none when history is off).
            bucket, expiry, now = self._cancel_record(queue, keys[0][: -len(":due")])
            n = self._evalsha(c.CANCEL, list(keys[:4]) + [c.tags_key(keys[0])] + list(keys[4:]) + [bucket], [id, expiry, now])
        except redis.RedisError as e:
            raise c.wrap("cancelling an order (cancel.lua)", e) from None
        return c.CancelOutcome.CANCELLED if int(n) == 1 else c.CancelOutcome.NOT_FOUND

    def cancel_tag(self, queue: str, tag: str) -> int:
        """Cancels every scheduled order of ``queue`` that carries ``tag``: tag_bulk.lua over
        each shard, at most 200 orders per call (each call atomic with dispatch: an order is
        cancelled or dispatched, never both), looped until none is left. Returns how many
        were cancelled; repeating it returns 0."""
        rules.check_queue(queue)
        rules.check_tags([tag])
        ref = self._queue_ref(queue)
        retention = self._retention(queue)
        total = 0
        for s in range(ref.shards):
            due = self._keys.due(queue, s)
            keys = [due, self._keys.payload(queue, s), self._keys.levels(queue, s), self._keys.tag(queue, s) + ":debounce", c.tags_key(due),
                    self._keys.tag(queue, s) + ":keyed", self._keys.tag(queue, s) + ":key_ring"]
            cursor: Any = b""
            while True:
                try:
                    bucket, expiry, now = self._cancel_record(queue, self._keys.tag(queue, s), retention)
                    reply = self._evalsha(c.TAG_BULK, keys + [bucket], [tag, c.TAG_BATCH, "cancel", "", cursor, expiry, now, c.cancel_reason("tag", tag)])
                except redis.RedisError as e:
                    raise c.wrap("cancelling the orders of a tag (tag_bulk.lua)", e) from None
                n, last, more = c.tag_bulk_step(reply)
                total += n
                if not more:
                    break
                cursor = last
        return total

    def post_event(self, name: str, data: Optional[Dict[str, Any]] = None, *, id: Optional[str] = None) -> Dict[str, Any]:
        """Posts an event (src/engine/client/events.rs): cancels the scheduled orders of every
        queue whose ``cancel_on`` rules name it and whose payload matches ``data``, and
        remembers it for the rules' windows (an order scheduled inside one is answered
        ``cancelled_by_event``). ``id`` makes a retried post harmless (``duplicate``).
        Returns ``{"name", "cancelled", "queues", "matched_rules", "duplicate"}``."""
        data = {} if data is None else data
        rules.check_event(name, data, id)
        out: Dict[str, Any] = {"name": name, "cancelled": 0, "queues": {}, "matched_rules": 0, "duplicate": False}
        if id is not None:
            out["id"] = id
        try:
            names = sorted(c._text(n) for n in self._r.smembers(self._keys.queues()))
            records = [self._r.hget(self._keys.record(q), "cancel_on") for q in names]
            fields = [self._r.hkeys(self._keys.record(q)) for q in names]
        except redis.RedisError as e:
            raise c.wrap("reading the queues' cancel_on rules", e) from None
        hits = rules.event_hits(name, data, names, records, fields)
        out["matched_rules"] = len(hits)
        now = self.now_ms()
        seen = None
        if id is not None:
            seen = "{%s}:event:%s" % (self._keys.ns, id)
            window = max([h[2] for h in hits] or [rules.DEFAULT_REMEMBER_MS])
            try:
                first = self._r.set(seen, now, nx=True, px=window)
            except redis.RedisError as e:
                raise c.wrap("recording the event id", e) from None
            if not first:
                out["duplicate"] = True
                out["matched_rules"] = 0
                return out
        reason = c.cancel_reason("event", name, id or "")
        try:
            for q, token, remember in hits:
                ref = self._lookup(q)
                if ref is None:
                    continue
                retention = self._retention(q)
                for s in range(ref.shards):
                    remembered = self._keys.tag(q, s) + ":remembered"
                    self._r.zadd(remembered, {token: now + remember}, gt=True)
                    self._r.zremrangebyscore(remembered, "-inf", now)
                    self._r.zremrangebyrank(remembered, 0, -(rules.MAX_REMEMBERED + 1))
                    due = self._keys.due(q, s)
                    keys = [due, self._keys.payload(q, s), self._keys.levels(q, s), self._keys.tag(q, s) + ":debounce", c.tags_key(due),
                            self._keys.tag(q, s) + ":keyed", self._keys.tag(q, s) + ":key_ring"]
                    cursor: Any = b""
                    while True:
                        bucket, expiry, at = self._cancel_record(q, self._keys.tag(q, s), retention)
                        reply = self._evalsha(c.TAG_BULK, keys + [bucket], [token, c.TAG_BATCH, "cancel", "", cursor, expiry, at, reason])
                        n, last, more = c.tag_bulk_step(reply)
                        if n:
                            out["cancelled"] += n
                            out["queues"][q] = out["queues"].get(q, 0) + n
                        if not more:
                            break
                        cursor = last
        except redis.RedisError as e:
            if seen is not None:
                try:
                    self._r.delete(seen)
                except redis.RedisError:
                    pass
            raise c.wrap("posting an event", e) from None
        return out

    def reschedule(
        self,
        queue: str,
        id: str,
        *,
        delay_ms: Optional[int] = None,
        due_ms: Optional[int] = None,
        delay: Optional[_dt.timedelta] = None,
        at: Optional[_dt.datetime] = None,
        priority: Union[str, c.Priority, None] = None,
        at_local: Optional[str] = None,
        timezone: Optional[str] = None,
    ) -> c.RescheduleOutcome:
        """Moves a scheduled order to a new due time (``at_local`` with ``timezone`` as in
        :meth:`schedule`), keeping its payload. ``priority``
        given (``"high"``, ``"normal"`` or ``"low"``): the order gets that level too, in the
        same atomic step; None (the default): it keeps its level."""
        level = None if priority is None else rules.check_priority(priority)
        rules.check_queue(queue)
        rules.check_id(id)
        due_at = rules.resolve_due(self.now_ms(), delay_ms, due_ms, delay, at, at_local, timezone)
        due, payload, levels, _, keyed, ring = self._shard_keys(queue, id)
        args: List[Any] = [id, due_at] if level is None else [id, due_at, level]
        try:
            n = self._evalsha(c.RESCHEDULE, [due, levels, payload, keyed, ring], args)
        except redis.RedisError as e:
            raise c.wrap("rescheduling an order (reschedule.lua)", e) from None
        return c.RescheduleOutcome.RESCHEDULED if int(n) == 1 else c.RescheduleOutcome.NOT_FOUND

    def get(self, queue: str, id: str) -> Optional[c.ScheduledOrder]:
        """A scheduled order (due time, payload, priority), or None when it is not
        scheduled."""
        keys = self._shard_keys(queue, id)
        try:
            reply = self._evalsha(c.GET, list(keys[:4]), [id])
        except redis.RedisError as e:
            raise c.wrap("reading an order (get.lua)", e) from None
        return c.decode_get(id, reply)
