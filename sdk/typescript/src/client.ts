// The producer API, as the Rust `Client`: schedule (one or a batch), cancel, reschedule, get.

import { type Conn, type Target, loadScript, openConn, parseRedisUrl } from "./connection.js";
import {
  DelayqError,
  InvalidInputError,
  type ItemOutcome,
  NotReplicatedError,
  PartialBatchError,
  QueueNotFoundError,
  RedisError,
  ReplyError,
} from "./errors.js";
import {
  MAX_SHARDS,
  RETENTION_FIELD,
  cancelReason,
  cancelRecord,
  checkId,
  checkNamespace,
  checkQueue,
  queueRecordKey,
  queuesKey,
  shardKeys,
  shardOf,
} from "./keys.js";
import {
  DEFAULT_MAX_PAYLOAD_BYTES,
  type NewOrder,
  type Priority,
  type When,
  MAX_ORDER_RULES,
  type OwnRule,
  checkCancelOn,
  checkOrder,
  orderRuleField,
  ownTokens,
  checkPriority,
  checkEvent,
  checkTags,
  decodeStored,
  eventToken,
  laneArg,
  orderTokens,
  storedRules,
  type StoredRule,
  payloadText,
  resolveWhen,
  storedBody,
  storedTags,
  rulesArg,
} from "./message.js";
import { SCRIPTS, type Script, isNoScript } from "./scripts.js";

/** Most orders per `scheduleMany` call. */
export const MAX_BATCH = 10_000;
/** Most orders per enqueue.lua call. */
export const ENQUEUE_CALL_ORDERS = 500;
/** Most payload bytes per enqueue.lua call. */
export const ENQUEUE_CALL_BYTES = 1 << 20;
/** The longest `WAIT` a durable schedule makes, ms. */
export const MAX_WAIT_MS = 60_000;
/** The prefix of a queue record's fields holding the rules its orders declared (src/engine/events.rs). */
const ORDER_RULE_PREFIX = "order_rule:";
/** How long a reply on the durable connection may take: the longest WAIT plus the writes. */
const DURABLE_RESPONSE_TIMEOUT_MS = 70_000;
/** The Redis clock is read again (TIME) when its anchor is older than this. */
const CLOCK_RESYNC_MS = 60_000;

/**
 * When a schedule counts as done: `"leader"` (as soon as the master has it, the default), or
 * once `replicas` replicas confirm it (`WAIT`) within `timeoutMs` (1 ..= 60,000); otherwise
 * the call fails with `NotReplicatedError` and the order, already on the leader, may still fire.
 */
export type Durability = "leader" | { replicas: number; timeoutMs: number };

/** How a schedule treats an id that is already scheduled. */
export type Mode = "upsert" | "if_absent";

export interface ClientOptions {
  /** Prefix of every key (default `dq`). */
  namespace?: string;
  /** Largest accepted payload, bytes of JSON text (default 64 KiB). */
  maxPayloadBytes?: number;
  /** When a schedule counts as done (default `"leader"`). */
  durability?: Durability;
  /** How long a command may wait for its reply (default 10 s). */
  responseTimeoutMs?: number;
  /** How long connecting may take (default 5 s). */
  connectTimeoutMs?: number;
  /** "Now" in unix ms (tests); default: the Redis server's clock (`TIME`). */
  clock?: () => number;
}

export type ScheduleOutcome = "created" | "updated" | "unchanged" | "duplicate" | "cancelled_by_event";
export type CancelOutcome = "cancelled" | "not_found";
export type RescheduleOutcome = "rescheduled" | "not_found";

/** What posting one event did (Client.postEvent). */
export interface EventPosted {
  /** The event's name. */
  name: string;
  /** Its id, if it had one. */
  id?: string;
  /** Orders it cancelled, over every queue. */
  cancelled: number;
  /** Per queue (queues with none left out). */
  queues: Record<string, number>;
  /** How many (queue, rule) pairs it matched. */
  matchedRules: number;
  /** Its id was posted before, within the window: nothing was done. */
  duplicate: boolean;
}

/** The result of scheduling one order. */
export interface Scheduled {
  id: string;
  /** The requested due time, unix ms (with `unchanged` the stored one may differ: see `get`). */
  dueAtMs: number;
  outcome: ScheduleOutcome;
  /** With `duplicate`: when the id was last dispatched, unix ms. */
  dispatchedAtMs?: number;
  /**
   * With `cancelled_by_event`: the name of the event that arrived first (within the rule's
   * remember window); nothing was written and the order never fires.
   */
  event?: string;
}

/** A scheduled order, as read back with `get`. */
export interface ScheduledOrder {
  id: string;
  /** When it is due, unix ms. */
  dueAtMs: number;
  /** When it was (last) scheduled, unix ms; null when stored without the documented encoding. */
  enqueuedAtMs: number | null;
  /** The payload's JSON text exactly as stored (`null` when the payload entry is missing). */
  payloadJson: string;
  /** The payload parsed with `JSON.parse` (numbers beyond 2^53 lose precision: use `payloadJson`). */
  payload: unknown;
  /** Its priority level (`normal` for an order scheduled without one). */
  priority: Priority;
  /** A debounced order's first call and cap (latest due time), unix ms. */
  debounce?: { firstCallMs: number; maxDueMs: number };
  /** Its tags (empty when it has none). */
  tags: string[];
  /** Its key (issue 42), when it has one. */
  key?: string;
}

interface QueueRef {
  shards: number;
  epoch: string | null;
  /** The version of its cancel_on rules ("" for none), sent after the epoch. */
  rulesVersion: string;
  /** Its cancel_on rules (empty: none). */
  rules: StoredRule[];
}

/** The Redis server's clock: `TIME` read once, advanced with the monotonic clock. */
class RedisClock {
  private anchorMono = 0;
  private anchorMs = 0;
  private syncing: Promise<void> | null = null;
  constructor(private readonly conn: () => Conn) {}
  async sync(): Promise<void> {
    const t0 = performance.now();
    const [s, us] = (await this.conn().time()) as [string | number, string | number];
    const t1 = performance.now();
    this.anchorMs = Number(s) * 1000 + Number(us) / 1000;
    this.anchorMono = (t0 + t1) / 2;
  }
  now(): number {
    const age = performance.now() - this.anchorMono;
    if (age > CLOCK_RESYNC_MS && this.syncing === null) {
      this.syncing = this.sync()
        .catch(() => {})
        .finally(() => {
          this.syncing = null;
        });
    }
    return Math.floor(this.anchorMs + age);
  }
}

interface Core {
  conn: Conn;
  target: Target;
  ns: string;
  maxPayloadBytes: number;
  responseTimeoutMs: number;
  connectTimeoutMs: number;
  now: () => number;
  known: Map<string, QueueRef>;
  durable: Promise<Conn> | null;
  closed: boolean;
}

/** One enqueue.lua call: orders (by batch index) of one shard. */
interface Call {
  shard: number;
  idxs: number[];
}

type Enqueued = { outcome: ScheduleOutcome; ms: number | null; event?: string };
type CallResult = { ok: Enqueued[] } | { err: DelayqError };

function checkDurability(d: unknown): Durability {
  if (d === "leader") return d;
  const r = d as { replicas?: unknown; timeoutMs?: unknown } | null;
  if (
    r !== null &&
    typeof r === "object" &&
    Number.isInteger(r.replicas) &&
    (r.replicas as number) >= 1 &&
    Number.isInteger(r.timeoutMs) &&
    (r.timeoutMs as number) >= 1 &&
    (r.timeoutMs as number) <= MAX_WAIT_MS
  ) {
    return { replicas: r.replicas as number, timeoutMs: r.timeoutMs as number };
  }
  throw new InvalidInputError(
    "invalid_option",
    `invalid option durability: "leader", or { replicas >= 1, timeoutMs 1..=${MAX_WAIT_MS} }`,
  );
}

function positiveInt(name: string, v: unknown, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1) {
    throw new InvalidInputError("invalid_option", `invalid option ${name}: must be a positive integer`);
  }
  return v;
}

function checkMode(mode: unknown): Mode {
  if (mode === undefined || mode === "upsert") return "upsert";
  if (mode === "if_absent") return "if_absent";
  throw new InvalidInputError("invalid_option", 'invalid option mode: "upsert" or "if_absent"');
}

/**
 * enqueue.lua's reply: a code per order, or `[code, ms]` (a duplicate's last dispatch, a
 * debounced order's due time), or `[4, token]` (cancelled by the token's event).
 */
function outcomes(codes: unknown, n: number): Enqueued[] {
  if (!Array.isArray(codes) || codes.length !== n) {
    throw new ReplyError("scheduling orders (enqueue.lua)", `${Array.isArray(codes) ? codes.length : "no"} outcomes for ${n} orders`);
  }
  return codes.map((raw) => {
    if (Array.isArray(raw) && Number(raw[0]) === 4) {
      // The event's name is the token's, up to the space.
      // An order rule's token carries its window: "<event>@<remember ms>".
      const event = (String(raw[1]).replace(/^\x01/, "").split(" ")[0] as string).split("@")[0] as string;
      return { outcome: "cancelled_by_event", ms: null, event };
    }
    const [c, ms] = Array.isArray(raw) ? [raw[0], Number(raw[1])] : [raw, null];
    switch (Number(c)) {
      case 1:
        return { outcome: "created", ms };
      case 2:
        return { outcome: "updated", ms };
      case 0:
        return { outcome: "unchanged", ms };
      case 3:
        return { outcome: "duplicate", ms };
      default:
        throw new ReplyError("scheduling orders (enqueue.lua)", `unknown outcome code ${String(c)}`);
    }
  });
}

/** enqueue.lua's ARGV[3]: `<epoch>\x1f<rules version>` ("" for no rules), as the Rust client sends it. */
function epochArg(ref: QueueRef): string {
  return `${ref.epoch as string}\x1f${ref.rulesVersion}`;
}

/** A reply error of enqueue.lua's registry checks. */
function scriptVerdict(e: unknown): "queue_not_found" | "stale_epoch" | null {
  const m = String((e as Error | undefined)?.message ?? "");
  if (m.startsWith("ERR delayq queue_not_found")) return "queue_not_found";
  if (m.startsWith("ERR delayq stale_epoch")) return "stale_epoch";
  return null;
}

/**
 * enqueue.lua refused a call because the queue's epoch in the shard is missing
 * (`queue_not_found`: deleted) or another (`stale_epoch`: deleted and created again).
 * Nothing of the call was written. Reported to callers as QueueNotFoundError.
 */
class ScriptRefusal extends DelayqError {
  constructor(verdict: "queue_not_found" | "stale_epoch", cause: unknown) {
    super("queue_not_found", `enqueue.lua refused the call: ${verdict}`, { cause });
  }
}

/** A pipeline's replies as `[error, value]` pairs; a broken connection fails every one. */
async function execPipeline(
  conn: Conn,
  build: (p: ReturnType<Conn["pipeline"]>) => void,
  count: number,
): Promise<[Error | null, unknown][]> {
  const p = conn.pipeline();
  build(p);
  try {
    const r = (await p.exec()) as [Error | null, unknown][] | null;
    if (!r || r.length !== count) throw new Error(`the pipeline answered ${r ? r.length : "nothing"} of ${count} replies`);
    return r;
  } catch (e) {
    return Array.from({ length: count }, () => [e as Error, null]);
  }
}

/**
 * A delayq producer on one Redis (or cluster) and one key namespace. Cheap handles with
 * another durability share its connections (`withDurability`).
 */
export class Client {
  private constructor(
    private readonly core: Core,
    /** How this handle's schedules are acknowledged. */
    readonly durability: Durability,
  ) {}

  /**
   * Connects. `url` is `redis://[user:pass@]host:port[/db]`, `rediss://` for TLS, or
   * `redis+cluster://host:port,host:port` (`rediss+cluster://`) for a Redis Cluster.
   */
  static async connect(url: string, options: ClientOptions = {}): Promise<Client> {
    const ns = checkNamespace(options.namespace ?? "dq");
    const maxPayloadBytes = positiveInt("maxPayloadBytes", options.maxPayloadBytes, DEFAULT_MAX_PAYLOAD_BYTES);
    const responseTimeoutMs = positiveInt("responseTimeoutMs", options.responseTimeoutMs, 10_000);
    const connectTimeoutMs = positiveInt("connectTimeoutMs", options.connectTimeoutMs, 5_000);
    const durability = checkDurability(options.durability ?? "leader");
    if (options.clock !== undefined && typeof options.clock !== "function") {
      throw new InvalidInputError("invalid_option", "invalid option clock: must be a function returning unix ms");
    }
    const target = parseRedisUrl(url);
    const conn = await openConn(target, { connectTimeoutMs, responseTimeoutMs });
    let now = options.clock;
    if (now === undefined) {
      const rc = new RedisClock(() => conn);
      try {
        await rc.sync();
      } catch (e) {
        conn.disconnect();
        throw new RedisError("reading the Redis clock (TIME)", e);
      }
      now = () => rc.now();
    }
    const core: Core = {
      conn,
      target,
      ns,
      maxPayloadBytes,
      responseTimeoutMs,
      connectTimeoutMs,
      now,
      known: new Map(),
      durable: null,
      closed: false,
    };
    return new Client(core, durability);
  }

  /** A handle on the same connections whose schedules have durability `d`. */
  withDurability(d: Durability): Client {
    return new Client(this.core, checkDurability(d));
  }

  /** The key namespace. */
  get namespace(): string {
    return this.core.ns;
  }

  /** True when connected to a Redis Cluster. */
  get isCluster(): boolean {
    return this.core.target.cluster;
  }

  /** "Now" on this client's clock (the Redis server's by default), unix ms. */
  nowMs(): number {
    return this.core.now();
  }

  /** Closes the connections. */
  async close(): Promise<void> {
    if (this.core.closed) return;
    this.core.closed = true;
    const durable = this.core.durable;
    this.core.durable = null;
    await Promise.allSettled([
      this.core.conn.quit(),
      durable?.then((c) => c.quit()),
    ]);
  }

  /**
   * Schedules one order (`mode` default `upsert`: a known id gets the new due time, payload
   * and priority; `order.priority` absent is `normal`).
   */
  async schedule(queue: string, order: NewOrder, options: { mode?: Mode } = {}): Promise<Scheduled> {
    try {
      const out = await this.scheduleMany(queue, [order], options);
      const first = out[0];
      if (!first) throw new ReplyError("scheduling an order", "no outcome");
      return first;
    } catch (e) {
      // A single order's error names no batch index.
      if (e instanceof InvalidInputError && e.index !== undefined) {
        throw new InvalidInputError(e.code, e.reason);
      }
      throw e;
    }
  }

  /**
   * Schedules a batch (at most 10,000 orders, each with its own `priority`). The whole batch is checked first: one invalid
   * order refuses it (`InvalidInputError` with its `index`) and nothing is written. Orders go
   * out at most 500 and 1 MiB of payloads per enqueue.lua call, one shard per call, the calls
   * pipelined; each call is atomic. When some calls fail after others succeeded, the error is
   * `PartialBatchError`, which says for every order whether it was written; repeating the
   * batch is safe. Returns one result per order, in order.
   */
  async scheduleMany(queue: string, orders: NewOrder[], options: { mode?: Mode } = {}): Promise<Scheduled[]> {
    const mode = checkMode(options.mode);
    if (!Array.isArray(orders)) throw new InvalidInputError("invalid_body", "orders must be an array");
    // 1. Each payload's JSON text, then its priority level, order by order.
    const levels: string[] = new Array(orders.length);
    const payloads = orders.map((o, i) => {
      try {
        if (o === null || typeof o !== "object") {
          throw new InvalidInputError("invalid_body", "an order must be an object");
        }
        const text = payloadText(o);
        levels[i] = laneArg(checkPriority(o.priority));
        return text;
      } catch (e) {
        throw e instanceof InvalidInputError ? e.inBatch(i) : e;
      }
    });
    // 2. The batch size, 3. the queue name, 4. each order.
    if (orders.length > MAX_BATCH) {
      throw new InvalidInputError("batch_too_large", `${orders.length} messages; at most ${MAX_BATCH} per call`);
    }
    checkQueue(queue);
    const now = this.core.now();
    const dues = orders.map((o, i) => {
      try {
        return checkOrder(o, payloads[i] as string, now, this.core.maxPayloadBytes);
      } catch (e) {
        throw e instanceof InvalidInputError ? e.inBatch(i) : e;
      }
    });
    if (mode === "if_absent") {
      const i = orders.findIndex((o) => o.debounce !== undefined && o.debounce !== null);
      if (i >= 0) {
        throw new InvalidInputError(
          "invalid_option",
          "invalid option debounce: cannot go with if_absent (a debounce moves a waiting order)",
        ).inBatch(i);
      }
    }
    // 5. The registry.
    let ref = await this.queueRef(queue);
    if (orders.length === 0) return [];
    const bytes = payloads.map((p) => Buffer.byteLength(p, "utf8"));
    const all = orders.map((_, i) => i);
    if (ref.epoch === null) {
      throw new QueueNotFoundError(queue, "its registry record has no epoch (written by an earlier delayq): `delayq queue create` upgrades it");
    }
    let tokens = this.matchTokens(orders, payloads, ref);
    // The orders' own rules are made known to events before any order carries them.
    await this.registerOrderRules(queue, orders);
    let calls = plan(orders, bytes, all, ref.shards);
    let done = await this.enqueueCalls(queue, epochArg(ref), calls, orders, dues, payloads, tokens, levels, now, mode);
    // Every call refused by enqueue.lua (nothing written): the queue was deleted, or deleted
    // and created again. Read the registry once more and retry with what it says.
    if (done.every((r) => "err" in r && r.err instanceof ScriptRefusal)) {
      this.core.known.delete(queue);
      const fresh = await this.queueRef(queue);
      if (fresh.shards === ref.shards && fresh.epoch === ref.epoch && fresh.rulesVersion === ref.rulesVersion) {
        throw new QueueNotFoundError(queue);
      }
      if (fresh.epoch === null) throw new QueueNotFoundError(queue);
      ref = fresh;
      // The rules may have changed: the orders' match tokens are computed again.
      tokens = this.matchTokens(orders, payloads, ref);
      calls = plan(orders, bytes, all, ref.shards);
      done = await this.enqueueCalls(queue, epochArg(ref), calls, orders, dues, payloads, tokens, levels, now, mode);
    }
    const results: (ItemOutcome | undefined)[] = new Array(orders.length);
    const extra: (number | null)[] = new Array(orders.length).fill(null);
    const events: (string | undefined)[] = new Array(orders.length);
    let failed: DelayqError | null = null;
    let succeeded = false;
    calls.forEach((c, k) => {
      const r = done[k] as CallResult;
      if ("ok" in r) {
        succeeded = true;
        c.idxs.forEach((i, j) => {
          results[i] = r.ok[j]?.outcome;
          extra[i] = r.ok[j]?.ms ?? null;
          events[i] = r.ok[j]?.event;
        });
        return;
      }
      let e = r.err;
      if (e instanceof ScriptRefusal) {
        this.core.known.delete(queue);
        e = new QueueNotFoundError(queue);
      }
      const o: ItemOutcome = e.writeOutcome === "not_applied" ? "not_written" : "unknown";
      for (const i of c.idxs) results[i] = o;
      // Keep the error that says the least: "may have been written" over "not written".
      if (failed === null || failed.writeOutcome === "not_applied") failed = e;
    });
    if (failed !== null) {
      const err: DelayqError = failed;
      if (!succeeded) throw err;
      throw new PartialBatchError(
        orders.map((o, i) => ({ id: o.id, outcome: results[i] ?? "unknown" })),
        err,
      );
    }
    return orders.map((o, i) => {
      const outcome = results[i];
      if (outcome === "cancelled_by_event") {
        return { id: o.id, dueAtMs: dues[i] as number, outcome, event: events[i] ?? "" };
      }
      if (outcome !== "created" && outcome !== "updated" && outcome !== "unchanged" && outcome !== "duplicate") {
        throw new ReplyError("scheduling orders", "an order got no outcome");
      }
      const ms = extra[i] ?? null;
      if (outcome === "duplicate") return { id: o.id, dueAtMs: dues[i] as number, outcome, dispatchedAtMs: ms ?? undefined };
      return { id: o.id, dueAtMs: ms ?? (dues[i] as number), outcome };
    });
  }

  /** The queue's history retention as its record holds it (null: the default). */
  private async retentionOf(queue: string): Promise<string | null> {
    return (await this.core.conn.hget(queueRecordKey(this.core.ns, queue), RETENTION_FIELD)) as string | null;
  }

  /** The history bucket, its expiry (0: history off) and now, for a cancellation in the shard `shardTag` (`retention` undefined: read from the record). */
  private async cancelRecordOf(queue: string, shardTag: string, retention?: string | null): Promise<{ bucket: string; expiresAt: number; now: number }> {
    const r = retention === undefined ? await this.retentionOf(queue) : retention;
    const now = this.nowMs();
    return { ...cancelRecord(shardTag, r, now), now };
  }

  /** Cancels a scheduled order: `not_found` when it was never scheduled, was cancelled or already dispatched. */
  async cancel(queue: string, id: string): Promise<CancelOutcome> {
    checkQueue(queue);
    checkId(id);
    const ref = await this.queueRef(queue);
    const k = shardKeys(this.core.ns, queue, shardOf(id, ref.shards));
    // The history bucket as KEYS[8] with its expiry and now: the cancellation is recorded
    // in the order history (cancel.lua; none when history is off).
    const h = await this.cancelRecordOf(queue, k.tag);
    const n = await this.evalScript(
      SCRIPTS.cancel,
      [k.due, k.payload, k.levels, k.debounce, k.tags, k.keyed, k.keyRing, h.bucket],
      [id, String(h.expiresAt), String(h.now)],
      "cancelling an order (cancel.lua)",
    );
    return Number(n) === 1 ? "cancelled" : "not_found";
  }

  /**
   * Cancels every scheduled order of `queue` that carries `tag` (see src/engine/tags.rs):
   * tag_bulk.lua over each shard, at most 200 orders per call (each call atomic with
   * dispatch: an order is cancelled or dispatched, never both), looped until none is left.
   * Answers how many were cancelled; repeating it answers 0.
   */
  async cancelTag(queue: string, tag: string): Promise<number> {
    checkQueue(queue);
    checkTags([tag]);
    const ref = await this.queueRef(queue);
    const retention = await this.retentionOf(queue);
    let total = 0;
    for (let shard = 0; shard < ref.shards; shard++) {
      const k = shardKeys(this.core.ns, queue, shard);
      let cursor = "";
      for (;;) {
        const h = await this.cancelRecordOf(queue, k.tag, retention);
        const r = await this.evalScript(SCRIPTS.tag_bulk, [k.due, k.payload, k.levels, k.debounce, k.tags, k.keyed, k.keyRing, h.bucket], [tag, "200", "cancel", "", cursor, String(h.expiresAt), String(h.now), cancelReason("tag", tag)], "cancelling the orders of a tag (tag_bulk.lua)");
        if (!Array.isArray(r) || r.length !== 3) throw new ReplyError("cancelling the orders of a tag (tag_bulk.lua)", "not an array of 3");
        total += Number(r[0]);
        if (Number(r[2]) !== 1 || r[1] === null || r[1] === undefined) break;
        cursor = String(r[1]);
      }
    }
    return total;
  }

  /**
   * Posts an event (src/engine/client/events.rs): cancels the scheduled orders of every
   * queue whose `cancel_on` rules name it and whose payload matches `data`, and remembers it
   * for the rules' windows (an order scheduled inside one is answered `cancelled_by_event`).
   * `id` makes a retried post harmless (`duplicate: true`, nothing cancelled).
   */
  async postEvent(name: string, data: Record<string, unknown> = {}, opts: { id?: string } = {}): Promise<EventPosted> {
    checkEvent(name, data, opts.id);
    const conn = this.core.conn;
    const out: EventPosted = { name, cancelled: 0, queues: {}, matchedRules: 0, duplicate: false };
    if (opts.id !== undefined) out.id = opts.id;
    const names = ((await conn.smembers(queuesKey(this.core.ns))) as string[]).sort();
    const hits: { queue: string; token: string; remember: number }[] = [];
    for (const q of names) {
      const rec = await conn.hget(queueRecordKey(this.core.ns, q), "cancel_on");
      let stored: { rules?: { event?: string; match?: string[]; remember_ms?: number }[] } = {};
      try {
        if (rec !== null) stored = JSON.parse(rec);
      } catch {
        stored = {};
      }
      for (const r of stored.rules ?? []) {
        if (r.event !== name) continue;
        const token = eventToken(name, r.match ?? [], data);
        if (token !== null) hits.push({ queue: q, token, remember: Number(r.remember_ms ?? 900_000) });
      }
      // The rules the queue's orders declared for themselves (fields `order_rule:<rule
      // JSON>`, src/engine/events.rs "Order rules"): their tokens carry their window.
      for (const f of (await conn.hkeys(queueRecordKey(this.core.ns, q))) as string[]) {
        if (!f.startsWith(ORDER_RULE_PREFIX)) continue;
        let r: { event?: string; match?: string[]; remember_ms?: number };
        try {
          r = JSON.parse(f.slice(ORDER_RULE_PREFIX.length));
        } catch {
          continue;
        }
        if (r.event !== name || typeof r.remember_ms !== "number") continue;
        const token = eventToken(`${name}@${r.remember_ms}`, r.match ?? [], data);
        if (token !== null) hits.push({ queue: q, token, remember: r.remember_ms });
      }
    }
    out.matchedRules = hits.length;
    const now = this.nowMs();
    let seen: string | null = null;
    if (opts.id !== undefined) {
      seen = `{${this.core.ns}}:event:${opts.id}`;
      const window = Math.max(900_000, ...hits.map((h) => h.remember));
      const first = await conn.set(seen, String(now), "PX", window, "NX");
      if (first === null) {
        out.duplicate = true;
        out.matchedRules = 0;
        return out;
      }
    }
    const reason = cancelReason("event", name, opts.id ?? "");
    try {
      for (const h of hits) {
        const ref = await this.queueRef(h.queue);
        const retention = await this.retentionOf(h.queue);
        for (let shard = 0; shard < ref.shards; shard++) {
          const k = shardKeys(this.core.ns, h.queue, shard);
          const remembered = `${k.tag}:remembered`;
          await conn.zadd(remembered, "GT", String(now + h.remember), h.token);
          await conn.zremrangebyscore(remembered, "-inf", String(now));
          await conn.zremrangebyrank(remembered, 0, -(100_000 + 1));
          let cursor = "";
          for (;;) {
            const rec = await this.cancelRecordOf(h.queue, k.tag, retention);
            const r = await this.evalScript(SCRIPTS.tag_bulk, [k.due, k.payload, k.levels, k.debounce, k.tags, k.keyed, k.keyRing, rec.bucket], [h.token, "200", "cancel", "", cursor, String(rec.expiresAt), String(rec.now), reason], "posting an event (tag_bulk.lua)");
            if (!Array.isArray(r) || r.length !== 3) throw new ReplyError("posting an event (tag_bulk.lua)", "not an array of 3");
            const n = Number(r[0]);
            if (n > 0) {
              out.cancelled += n;
              out.queues[h.queue] = (out.queues[h.queue] ?? 0) + n;
            }
            if (Number(r[2]) !== 1 || r[1] === null || r[1] === undefined) break;
            cursor = String(r[1]);
          }
        }
      }
    } catch (e) {
      // Not applied in full: the id is forgotten so that a retry does the rest.
      if (seen !== null) await conn.del(seen).catch(() => undefined);
      throw e;
    }
    return out;
  }

  /**
   * Moves a scheduled order to a new due time, keeping its payload. With `priority`, the
   * order gets that level too (both change together, or neither); without, it keeps its level.
   */
  async reschedule(
    queue: string,
    id: string,
    when: When,
    options: { priority?: Priority } = {},
  ): Promise<RescheduleOutcome> {
    const level = options?.priority === undefined || options.priority === null ? null : checkPriority(options.priority);
    checkQueue(queue);
    checkId(id);
    if (when === null || typeof when !== "object") {
      throw new InvalidInputError("invalid_due_time", "invalid due time: give exactly one of delayMs or at");
    }
    const due = resolveWhen(when, this.core.now());
    const ref = await this.queueRef(queue);
    const k = shardKeys(this.core.ns, queue, shardOf(id, ref.shards));
    const args = level === null ? [id, String(due)] : [id, String(due), level];
    const n = await this.evalScript(
      SCRIPTS.reschedule,
      [k.due, k.levels, k.payload, k.keyed, k.keyRing],
      args,
      "rescheduling an order (reschedule.lua)",
    );
    return Number(n) === 1 ? "rescheduled" : "not_found";
  }

  /** Reads a scheduled order: its due time, payload and priority; null when it is not scheduled. */
  async get(queue: string, id: string): Promise<ScheduledOrder | null> {
    checkQueue(queue);
    checkId(id);
    const ref = await this.queueRef(queue);
    const k = shardKeys(this.core.ns, queue, shardOf(id, ref.shards));
    const r = await this.evalScript(SCRIPTS.get, [k.due, k.payload, k.levels, k.debounce], [id], "reading an order (get.lua)");
    if (!Array.isArray(r) || r.length !== 4) throw new ReplyError("reading an order (get.lua)", "not an array of 4");
    const [score, raw, stored, deb] = r as [string | null, string | null, string | null, string | null];
    if (score === null || score === undefined) return null;
    const dueAtMs = Math.round(Number(score));
    // Absent, or anything but high / low (a foreign writer's): normal, as the Rust client reads it.
    const priority: Priority = stored === "high" || stored === "low" ? stored : "normal";
    const m = deb === null || deb === undefined ? null : /^([0-9]+):([0-9]+)$/.exec(String(deb));
    const debounce = m ? { debounce: { firstCallMs: Number(m[1]), maxDueMs: Number(m[2]) } } : {};
    if (raw === null || raw === undefined) {
      return { id, dueAtMs, enqueuedAtMs: null, payloadJson: "null", payload: null, priority, tags: [], ...debounce };
    }
    const { enqueuedAtMs, json, key } = decodeStored(String(raw));
    let payload: unknown;
    try {
      payload = JSON.parse(json);
    } catch {
      payload = json;
    }
    const keyed = key === undefined ? {} : { key };
    return { id, dueAtMs, enqueuedAtMs, payloadJson: json, payload, priority, tags: storedTags(String(raw)), ...debounce, ...keyed };
  }

  // ---- internals ----

  /** The shard count and epoch of a registered queue (cached); QueueNotFoundError when it is not. */
  private async queueRef(queue: string): Promise<QueueRef> {
    const cached = this.core.known.get(queue);
    if (cached) return cached;
    let reply: (string | null)[];
    try {
      reply = await this.core.conn.hmget(queueRecordKey(this.core.ns, queue), "shards", "epoch", "cancel_on");
    } catch (e) {
      throw new RedisError("reading the queue registry", e);
    }
    const [shards, epoch, cancelOn] = reply;
    if (shards === null || shards === undefined) throw new QueueNotFoundError(queue);
    const n = Number(shards);
    if (!/^[0-9]+$/.test(shards) || n < 1 || n > MAX_SHARDS) {
      throw new ReplyError("reading the queue registry", `the record's shard count is ${JSON.stringify(shards)}`);
    }
    const stored = storedRules(cancelOn);
    const ref = { shards: n, epoch: epoch ?? null, rulesVersion: stored.v, rules: stored.rules };
    if (ref.epoch !== null) this.core.known.set(queue, ref);
    return ref;
  }

  /** EVALSHA of one script on the shared connection; loads it on NOSCRIPT and tries again. */
  private async evalScript(script: Script, keys: string[], args: string[], context: string): Promise<unknown> {
    const conn = this.core.conn;
    try {
      try {
        return await conn.evalsha(script.sha, keys.length, ...keys, ...args);
      } catch (e) {
        if (!isNoScript(e)) throw e;
        await loadScript(conn, script);
        return await conn.evalsha(script.sha, keys.length, ...keys, ...args);
      }
    } catch (e) {
      throw new RedisError(context, e);
    }
  }

  /**
   * Each order's match tokens under the queue's cancel_on rules (none without rules); a
   * payload value over 256 bytes at a match path is refused naming `cancel_on`.
   */
  private matchTokens(orders: NewOrder[], payloads: string[], ref: QueueRef): string[][] {
    const own = orders.map((o) => checkCancelOn(o.cancelOn));
    if (ref.rules.length === 0 && own.every((r) => r.length === 0)) return [];
    return orders.map((_, i) => {
      try {
        // The queue's rules, then the order's own (their tokens carry their window).
        return [...orderTokens(ref.rules, payloads[i] as string), ...ownTokens(own[i] as OwnRule[], payloads[i] as string)];
      } catch (e) {
        throw e instanceof InvalidInputError ? e.inBatch(i) : e;
      }
    });
  }

  /** Registers in the queue's record the rules the orders declare for themselves (order_rules.lua; nothing when none does), as the Rust client does. */
  private async registerOrderRules(queue: string, orders: NewOrder[]): Promise<void> {
    const fields = [...new Set(orders.flatMap((o) => checkCancelOn(o.cancelOn).map(orderRuleField)))].sort();
    if (fields.length === 0) return;
    const n = Number(await this.evalScript(SCRIPTS.order_rules, [queueRecordKey(this.core.ns, queue)], [String(MAX_ORDER_RULES), ...fields], "registering the orders' cancel_on rules (order_rules.lua)"));
    if (n === -1) {
      this.core.known.delete(queue);
      throw new QueueNotFoundError(queue);
    }
    if (n === -2) {
      throw new InvalidInputError("invalid_option", `invalid option cancel_on: the orders of ${queue} already declare ${MAX_ORDER_RULES} distinct rules: use the queue's rules, or fewer distinct ones`);
    }
  }

  /** Runs the planned enqueue.lua calls; one result per call, in call order. */
  private async enqueueCalls(
    queue: string,
    epoch: string,
    calls: Call[],
    orders: NewOrder[],
    dues: number[],
    payloads: string[],
    tokens: string[][],
    levels: string[],
    now: number,
    mode: Mode,
  ): Promise<CallResult[]> {
    // The form the Rust client sends: every shard key (KEYS[1..10]: the tag index is KEYS[6],
    // the debounce HASH KEYS[7], the key index and ring KEYS[8..9], the remembered events
    // KEYS[10]; the epoch argument is "<epoch>\x1f<rules version>"), the columns named in
    // the mode ("upsert+tags:rk"), one quadruple per order (id, due, payload, level; "" for
    // normal), then the rules column when an order of the call carries time rules and the
    // key column ("" for none) when one has a key.
    const argv = calls.map((c) => {
      const k = shardKeys(this.core.ns, queue, c.shard);
      // A call with tagged orders says so in its mode (enqueue.lua does no tag work otherwise).
      const tagged = c.idxs.some((i) => ((orders[i] as NewOrder).tags ?? []).length > 0 || (tokens[i] ?? []).length > 0);
      const withRules = c.idxs.some((i) => rulesArg(orders[i] as NewOrder) !== "");
      const withKeys = c.idxs.some((i) => {
        const key = (orders[i] as NewOrder).key;
        return key !== undefined && key !== null;
      });
      const cols = (withRules ? "r" : "") + (withKeys ? "k" : "");
      const args: string[] = [`${mode === "if_absent" ? "nx" : "upsert"}${tagged ? "+tags" : ""}:${cols}`, String(now), epoch];
      for (const i of c.idxs) {
        const o = orders[i] as NewOrder;
        args.push(o.id, String(dues[i]), storedBody(o, payloads[i] as string, tokens[i]), levels[i] as string);
        if (withRules) args.push(rulesArg(o));
        if (withKeys) args.push(o.key ?? "");
      }
      const keys = [k.due, k.payload, k.meta, k.levels, k.dispatched, k.tags, k.debounce, k.keyed, k.keyRing, `${k.tag}:remembered`];
      return { keys, args, n: c.idxs.length };
    });
    // One pipeline per server: on a cluster each shard is its own slot (its pipeline goes to
    // the node that holds it); on one server every call goes together.
    const groups: number[][] = [];
    if (this.core.target.cluster) {
      const byShard = new Map<number, number[]>();
      calls.forEach((c, i) => {
        const g = byShard.get(c.shard) ?? [];
        g.push(i);
        byShard.set(c.shard, g);
      });
      groups.push(...byShard.values());
    } else {
      groups.push(calls.map((_, i) => i));
    }
    const d = this.durability;
    let conn: Conn;
    if (d === "leader") {
      conn = this.core.conn;
    } else {
      try {
        conn = await this.durableConn();
      } catch (e) {
        const err = e instanceof DelayqError ? e : new RedisError("opening the durable connection", e);
        return calls.map(() => ({ err }));
      }
    }
    const out: CallResult[] = new Array(calls.length);
    await Promise.all(
      groups.map(async (g) => {
        const res = await enqueuePipeline(conn, g.map((i) => argv[i] as (typeof argv)[number]), d);
        g.forEach((i, j) => {
          out[i] = res[j] as CallResult;
        });
      }),
    );
    return out;
  }

  /**
   * The connection durable schedules use (opened on first use, with enqueue.lua loaded):
   * its WAITs block it, so nothing else shares it.
   */
  private durableConn(): Promise<Conn> {
    if (this.core.durable === null) {
      const p = (async () => {
        const conn = await openConn(this.core.target, {
          connectTimeoutMs: this.core.connectTimeoutMs,
          responseTimeoutMs: DURABLE_RESPONSE_TIMEOUT_MS,
        });
        try {
          await loadScript(conn, SCRIPTS.enqueue);
        } catch (e) {
          conn.disconnect();
          throw new RedisError("loading enqueue.lua", e);
        }
        return conn;
      })();
      this.core.durable = p;
      p.catch(() => {
        if (this.core.durable === p) this.core.durable = null;
      });
    }
    return this.core.durable;
  }
}

/**
 * Groups a batch (the orders `todo`, by batch index) by shard, keeping batch order within a
 * shard, and cuts it into calls of at most 500 orders and 1 MiB of payloads.
 */
function plan(orders: NewOrder[], bytes: number[], todo: number[], shards: number): Call[] {
  const byShard: number[][] = Array.from({ length: shards }, () => []);
  for (const i of todo) (byShard[shardOf((orders[i] as NewOrder).id, shards)] as number[]).push(i);
  const calls: Call[] = [];
  byShard.forEach((idxs, shard) => {
    let start = 0;
    while (start < idxs.length) {
      let end = start;
      let size = 0;
      while (
        end < idxs.length &&
        end - start < ENQUEUE_CALL_ORDERS &&
        (end === start || size + (bytes[idxs[end] as number] as number) <= ENQUEUE_CALL_BYTES)
      ) {
        size += bytes[idxs[end] as number] as number;
        end++;
      }
      calls.push({ shard, idxs: idxs.slice(start, end) });
      start = end;
    }
  });
  return calls;
}

/**
 * Runs enqueue.lua calls as one pipeline on `conn`, followed (durable writes) by `WAIT
 * replicas timeout` in the same pipeline, so the WAIT runs on the connection that made the
 * writes. A NOSCRIPT loads the script and sends the refused calls again (with a WAIT of
 * their own): nothing of them was written. Durable: a connection lost anywhere in between
 * fails the calls with NotReplicatedError (they may have reached the leader).
 */
async function enqueuePipeline(
  conn: Conn,
  calls: { keys: string[]; args: string[]; n: number }[],
  d: Durability,
): Promise<CallResult[]> {
  const out: (CallResult | undefined)[] = new Array(calls.length);
  const sha = SCRIPTS.enqueue.sha;
  const wait = d === "leader" ? null : { replicas: d.replicas, timeoutMs: Math.max(1, Math.min(d.timeoutMs, MAX_WAIT_MS)) };
  const notReplicated = (acked: number) =>
    new NotReplicatedError(acked, wait?.replicas ?? 0, wait?.timeoutMs ?? 0);
  for (let round = 0; round < 2; round++) {
    const todo = calls.map((_, i) => i).filter((i) => out[i] === undefined);
    if (todo.length === 0) break;
    const replies = await execPipeline(
      conn,
      (p) => {
        for (const i of todo) {
          const c = calls[i] as (typeof calls)[number];
          p.evalsha(sha, c.keys.length, ...c.keys, ...c.args);
        }
        if (wait) p.call("WAIT", String(wait.replicas), String(wait.timeoutMs));
      },
      todo.length + (wait ? 1 : 0),
    );
    let acked = 0;
    if (wait) {
      const [werr, wval] = replies[todo.length] as [Error | null, unknown];
      acked = werr ? 0 : Number(wval) || 0;
      // The connection broke between the writes and WAIT's reply.
      if (werr && !(werr.name === "ReplyError")) {
        for (const i of todo) out[i] = { err: notReplicated(0) };
        break;
      }
    }
    let noscript = false;
    todo.forEach((i, j) => {
      const [err, val] = replies[j] as [Error | null, unknown];
      const c = calls[i] as (typeof calls)[number];
      if (err) {
        if (round === 0 && isNoScript(err)) {
          noscript = true;
          return;
        }
        const verdict = scriptVerdict(err);
        if (verdict !== null) {
          out[i] = { err: new ScriptRefusal(verdict, err) };
        } else if (wait && err.name !== "ReplyError") {
          out[i] = { err: notReplicated(0) };
        } else {
          out[i] = { err: new RedisError("scheduling orders (enqueue.lua)", err) };
        }
        return;
      }
      try {
        const o = outcomes(val, c.n);
        out[i] = wait && acked < wait.replicas ? { err: notReplicated(acked) } : { ok: o };
      } catch (e) {
        out[i] = { err: e as DelayqError };
      }
    });
    if (noscript) {
      try {
        await loadScript(conn, SCRIPTS.enqueue);
      } catch (e) {
        const err = new RedisError("loading enqueue.lua", e);
        for (let i = 0; i < out.length; i++) if (out[i] === undefined) out[i] = { err };
      }
    }
  }
  return out.map((r) => r ?? { err: wait ? notReplicated(0) : new ReplyError("scheduling orders", "a call got no result") });
}

