// Names and the Redis key layout (ARCHITECTURE.md, "Redis key layout"): the same rules and
// the same keys as the Rust crate's `engine::keys`.

import { InvalidInputError } from "./errors.js";

/** Longest queue name or namespace, bytes. */
export const MAX_NAME_LEN = 64;
/** Longest order id, bytes. */
export const MAX_ID_LEN = 256;
/** Most shards a queue may have. */
export const MAX_SHARDS = 1024;

const NAME_CHAR = /^[A-Za-z0-9._-]$/;

/** Why `name` breaks the `[A-Za-z0-9._-]{1,64}` rule, or null. */
function nameProblem(name: unknown): string | null {
  if (typeof name !== "string") return "must be a string";
  if (name === "") return "must not be empty";
  if (name === "." || name === "..") return `${JSON.stringify(name)} is reserved`;
  const bytes = Buffer.byteLength(name, "utf8");
  if (bytes > MAX_NAME_LEN) return `must be at most ${MAX_NAME_LEN} bytes, got ${bytes}`;
  for (const c of name) {
    if (!NAME_CHAR.test(c)) {
      return `character ${JSON.stringify(c)} is not allowed (use A-Z a-z 0-9 . _ -)`;
    }
  }
  return null;
}

/** Checks a queue name (`invalid_queue`). */
export function checkQueue(name: unknown): string {
  const p = nameProblem(name);
  if (p !== null) throw new InvalidInputError("invalid_queue", `invalid queue name: ${p}`);
  return name as string;
}

/** Checks a key namespace (`invalid_namespace`). */
export function checkNamespace(name: unknown): string {
  const p = nameProblem(name);
  if (p !== null) throw new InvalidInputError("invalid_namespace", `invalid namespace: ${p}`);
  return name as string;
}

/** True when `s` holds a lone surrogate (it has no UTF-8 form). */
export function hasLoneSurrogate(s: string): boolean {
  return /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

/** Rust's `char::is_control`: the Unicode control characters (Cc). */
function isControl(cp: number): boolean {
  return cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f);
}

/** Checks an order id: 1..=256 bytes of UTF-8, no control characters (`invalid_id`). */
export function checkId(id: unknown): string {
  const bad = (reason: string) => new InvalidInputError("invalid_id", `invalid id: ${reason}`);
  if (typeof id !== "string") throw bad("must be a string");
  if (id === "") throw bad("must not be empty");
  if (hasLoneSurrogate(id)) throw bad("is not valid Unicode (a lone surrogate)");
  const bytes = Buffer.byteLength(id, "utf8");
  if (bytes > MAX_ID_LEN) throw bad(`must be at most ${MAX_ID_LEN} bytes, got ${bytes}`);
  let pos = 0;
  for (const c of id) {
    if (isControl(c.codePointAt(0) ?? 0)) throw bad(`control character at position ${pos}`);
    pos++;
  }
  return id;
}

/** Longest order key, in bytes (src/engine/order_key.rs). */
export const MAX_KEY_LEN = 128;

/**
 * Checks an order's key (issue 42) as the Rust `engine::order_key::validate`: the id rule
 * (1..=128 bytes of UTF-8, no control characters); `invalid_option` naming `key` otherwise.
 */
export function checkKey(key: unknown): string {
  const bad = (reason: string) => new InvalidInputError("invalid_option", `invalid option key: ${reason}`);
  if (typeof key !== "string") throw bad("must be a string");
  if (key === "") throw bad("must not be empty");
  if (hasLoneSurrogate(key)) throw bad("is not valid Unicode (a lone surrogate)");
  const bytes = Buffer.byteLength(key, "utf8");
  if (bytes > MAX_KEY_LEN) throw bad(`must be at most ${MAX_KEY_LEN} bytes, got ${bytes}`);
  let pos = 0;
  for (const c of key) {
    if (isControl(c.codePointAt(0) ?? 0)) throw bad(`control character at position ${pos}`);
    pos++;
  }
  return key;
}

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const MASK64 = 0xffffffffffffffffn;

/** FNV-1a 64 of the UTF-8 bytes of `id`. */
export function fnv1a64(id: string): bigint {
  let h = FNV_OFFSET;
  for (const b of Buffer.from(id, "utf8")) {
    h ^= BigInt(b);
    h = (h * FNV_PRIME) & MASK64;
  }
  return h;
}

/** The shard of an order id: FNV-1a 64 of its UTF-8 bytes modulo the shard count. */
export function shardOf(id: string, shards: number): number {
  if (shards <= 1) return 0;
  return Number(fnv1a64(id) % BigInt(shards));
}

/** The keys of one shard; all share the hash tag `{ns:queue:shard}`. */
export interface ShardKeys {
  tag: string;
  shard: number;
  /** ZSET: order id scored by due time (unix ms). */
  due: string;
  /** HASH: order id -> `"<enqueued_ms>:<payload JSON>"`. */
  payload: string;
  /** HASH: the shard's marker (`epoch` while the queue exists). */
  meta: string;
  /** HASH: order id -> `high` or `low`, for the scheduled orders that are not `normal`. */
  levels: string;
  /** The ids dispatched within the queue's dedup window (ZSET). */
  dispatched: string;
  /** Waiting debounced orders' first call and cap (HASH). */
  debounce: string;
  /** The tag index: `<tag>\x1f<id>` per tag of each scheduled order (ZSET, score 0). */
  tags: string;
  /** ZSET: the key index (issue 42; lua/keyed.lua). */
  keyed: string;
  /** ZSET: the keys with scheduled orders, scored by their earliest due time. */
  keyRing: string;
}

export function shardKeys(ns: string, queue: string, shard: number): ShardKeys {
  const tag = `{${ns}:${queue}:${shard}}`;
  return { tag, shard, due: `${tag}:due`, payload: `${tag}:payload`, meta: `${tag}:meta`, levels: `${tag}:levels`, dispatched: `${tag}:dispatched`, debounce: `${tag}:debounce`, tags: `${tag}:tags`, keyed: `${tag}:keyed`, keyRing: `${tag}:key_ring` };
}

/** The queue's registry record (HASH: `shards`, `epoch`, ...). */
export function queueRecordKey(ns: string, queue: string): string {
  return `{${ns}}:queue:${queue}`;
}

/** The SET of registered queue names. */
export function queuesKey(ns: string): string {
  return `{${ns}}:queues`;
}

/** The order history (src/engine/history.rs): the record field of a queue's retention (ms),
 * the retention when it says nothing (24 h), the longest (90 days), the bucket length (1 h). */
export const RETENTION_FIELD = "history_ms";
export const DEFAULT_HISTORY_MS = 24 * 3600 * 1000;
export const MAX_HISTORY_MS = 90 * 24 * 3600 * 1000;
export const HISTORY_BUCKET_MS = 3_600_000;

/**
 * Where cancel.lua / tag_bulk.lua record a cancellation at `now` (src/engine/history.rs
 * `HistoryPolicy::cancel_target`): the shard's history bucket of `now`
 * (`{tag}:history:<bucket ms>:<bucket>`) and its expiry, 0 when the queue keeps no history
 * (`retention`: the record's `history_ms` as read, null for the default).
 */
export function cancelRecord(shardTag: string, retention: string | null, now: number): { bucket: string; expiresAt: number } {
  let r = retention === null ? DEFAULT_HISTORY_MS : Number(retention);
  if (!Number.isFinite(r)) r = DEFAULT_HISTORY_MS;
  r = Math.min(Math.max(Math.trunc(r), 0), MAX_HISTORY_MS);
  const b = Math.floor(now / HISTORY_BUCKET_MS);
  return { bucket: `${shardTag}:history:${HISTORY_BUCKET_MS}:${b}`, expiresAt: r > 0 ? (b + 1) * HISTORY_BUCKET_MS + r : 0 };
}

/** A cancel record's reason (src/engine/history.rs `CancelledBy`): `id`, `tag<US><tag>` or
 * `event<US><name><US><event id or empty>`. */
export function cancelReason(kind: "id" | "tag" | "event", ...parts: string[]): string {
  return [kind, ...parts].join("\x1f");
}
