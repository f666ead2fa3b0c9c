// What producers send: an order id, when it is due, a JSON payload (kept as text, byte for
// byte) and a priority level, checked by the same rules as the Rust crate's
// `engine::message` and `engine::priority`.

import { InvalidInputError } from "./errors.js";
import { checkId, checkKey, hasLoneSurrogate } from "./keys.js";

/** The furthest ahead an order may be scheduled: 10 years (3,653 days), ms. */
export const MAX_AHEAD_MS = 3653 * 24 * 3600 * 1000;
/** Unix ms of 2000-01-01T00:00:00Z: a smaller timestamp (a number, or text) looks like seconds; a Date may be earlier. */
export const YEAR_2000_MS = 946_684_800_000;
/** Deepest nesting of arrays and objects a payload may have. */
export const MAX_PAYLOAD_DEPTH = 64;
/** Default payload limit: 64 KiB of JSON text. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024;

/**
 * JSON text kept byte for byte: as a whole payload, or nested inside a JS value (then it is
 * embedded as is). Use it for numbers a JS number cannot hold
 * (`{"amount": jsonText("123456789012345678901234567890")}`) or for text that must be stored
 * exactly as the caller wrote it.
 */
export class JsonText {
  readonly text: string;
  constructor(text: string) {
    if (typeof text !== "string") {
      throw new InvalidInputError("invalid_payload", "invalid payload: JSON text must be a string");
    }
    this.text = text;
  }
  toString(): string {
    return this.text;
  }
}

/** Shorthand for `new JsonText(text)`. */
export function jsonText(text: string): JsonText {
  return new JsonText(text);
}

/** When an order is due: exactly one of `delayMs` (from now, on the Redis clock) or `at`. */
export interface When {
  /** Due this many milliseconds after now (0 ..= 10 years). */
  delayMs?: number | bigint;
  /**
   * Due at this instant: a `Date`, unix milliseconds (number or bigint), or text (RFC 3339
   * with an offset such as `2026-11-22T10:30:00+01:00`, or unix milliseconds `"1795000000000"`).
   */
  at?: Date | number | bigint | string;
  /**
   * Due at this local wall-clock time (`"2027-03-28T09:00"`, optionally `:SS` and a fraction,
   * no offset) of `timezone`, instead of `delayMs` or `at`; resolved once, when scheduled, by
   * the recurring schedules' rules: a time that does not exist (spring forward) is the end of
   * the gap, one that happens twice (fall back) its first occurrence.
   */
  atLocal?: string;
  /** The IANA time zone of `atLocal` (`"Europe/Berlin"`, case-insensitive); only with it. */
  timezone?: string;
}

/**
 * An order's priority level: consumers take every due `high` order before any `normal` one,
 * and every `normal` one before any `low` one (or share reads by weight, as the engine's
 * worker is configured). `normal` is the default.
 */
export type Priority = "high" | "normal" | "low";

/** The priority levels, most urgent first. */
export const PRIORITIES: readonly Priority[] = Object.freeze(["high", "normal", "low"] as const);

/** Characters Rust's `{:?}` writes as `\u{..}`: not printable, or grapheme extenders. */
const RUST_ESCAPED = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}\p{Grapheme_Extend}]$/u;
const RUST_SHORT: Record<string, string> = { "\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"' };

/** `text` quoted as Rust's `format!("{text:?}")` writes it (how the Rust client's errors quote what they refuse). */
export function rustDebug(text: string): string {
  let out = '"';
  for (const ch of text) {
    const short = RUST_SHORT[ch];
    if (short !== undefined) out += short;
    else if (ch !== " " && RUST_ESCAPED.test(ch)) out += `\\u{${(ch.codePointAt(0) as number).toString(16)}}`;
    else out += ch;
  }
  return `${out}"`;
}

/**
 * Checks a priority level as the Rust `Priority::parse`: exactly `high`, `normal` or `low`
 * (`invalid_priority` otherwise, with the Rust message). `undefined` and `null` are `normal`.
 */
export function checkPriority(level: unknown): Priority {
  if (level === undefined || level === null) return "normal";
  if (typeof level !== "string") {
    throw new InvalidInputError("invalid_priority", `invalid priority: must be a string (high, normal or low), got ${typeof level}`);
  }
  if (level === "high" || level === "normal" || level === "low") return level;
  throw new InvalidInputError("invalid_priority", `invalid priority: ${rustDebug(level)} is not high, normal or low`);
}

/** A checked level as enqueue.lua takes it: `""` for normal (the cheapest argument), else its name. */
export function laneArg(level: Priority): string {
  return level === "normal" ? "" : level;
}

/** One order to schedule. */
export interface NewOrder extends When {
  /** The business id: 1..=256 bytes of UTF-8, no control characters. */
  id: string;
  /**
   * The payload as a JS value (serialized as JSON; bigints are written as JSON numbers,
   * `JsonText` values are embedded as is), or a `JsonText`. Default `null`.
   */
  payload?: unknown;
  /** The payload as JSON text, kept byte for byte (instead of `payload`). */
  payloadJson?: string;
  /** Its priority level: `"high"`, `"normal"` (the default) or `"low"`. */
  priority?: Priority;
  /**
   * Not handed to a consumer group later than this many ms past the due time (1 ..= 10
   * years, else `invalid_option`): that group dead-letters it with reason `expired`
   * instead. Absent: the queue's default, if any (see src/engine/expiry.rs).
   */
  expiresAfterMs?: number;
  /**
   * A debounce instead of a due time: due `delayMs` after each call (payload replaced),
   * never later than `maxWaitMs` after the first call (see the Rust `delayq::Debounce`).
   */
  debounce?: Debounce;
  /** Schedule it even if it was dispatched within the queue's dedup window. */
  repeat?: boolean;
  /**
   * Its tags (at most 10, each 1..=128 bytes without control characters, none twice, else
   * `invalid_option`): list, count, cancel or reschedule every order with a tag at once.
   * An upsert replaces the set (see src/engine/tags.rs).
   */
  tags?: string[];
  /**
   * The order's key (issue 42; 1..=128 bytes, no control characters, else
   * `invalid_option`): due orders are dispatched round robin between keys. An upsert
   * without a key removes the one the order had.
   */
  key?: string;
  /**
   * The order's own cancel-on-event rules (`[{event: "order.paid", match: "order_id",
   * rememberMs: 900_000}]`, checked as a queue's, else `invalid_option` naming
   * `cancel_on`): an event a rule names whose data matches the payload on its match paths
   * cancels the order (src/engine/events.rs, "Order rules").
   */
  cancelOn?: CancelRule[];
}

/** One cancel-on-event rule of an order: the event, its match path(s) and how long an event that arrives first is remembered (default 15 min). */
export interface CancelRule {
  event: string;
  match: string | string[];
  rememberMs?: number;
}

/** Most tags per order, and the longest tag in bytes (src/engine/tags.rs). */
export const MAX_TAGS = 10;
export const MAX_TAG_LEN = 128;

/** Checks an order's tags as the Rust `engine::tags::validate`; `invalid_option` naming `tags` otherwise. */
export function checkTags(tags: unknown): string[] {
  if (tags === undefined || tags === null) return [];
  const bad = (reason: string) => new InvalidInputError("invalid_option", `invalid option tags: ${reason}`);
  if (!Array.isArray(tags)) throw bad("must be an array of strings");
  if (tags.length > MAX_TAGS) throw bad(`at most ${MAX_TAGS} tags per order, got ${tags.length}`);
  const seen = new Set<string>();
  tags.forEach((t: unknown, i: number) => {
    if (typeof t !== "string") throw bad("must be an array of strings");
    if (hasLoneSurrogate(t)) throw bad(`tag ${i}: not valid Unicode (a lone surrogate)`);
    const n = Buffer.byteLength(t, "utf8");
    if (n === 0) throw bad(`tag ${i}: must not be empty`);
    if (n > MAX_TAG_LEN) throw bad(`tag ${i}: must be at most ${MAX_TAG_LEN} bytes, got ${n}`);
    const c = [...t].findIndex((ch) => /[\u0000-\u001f\u007f-\u009f]/.test(ch));
    if (c >= 0) throw bad(`tag ${i}: control character at position ${c}`);
    if (seen.has(t)) throw bad(`tag ${i} (${JSON.stringify(t)}) is given twice`);
    seen.add(t);
  });
  return tags as string[];
}

/**
 * The tags of a stored value: the list between its first two GS (none: empty), without the
 * cancel-on-event match tokens stored among them (they start with \x01; src/engine/events.rs).
 */
export function storedTags(raw: string): string[] {
  const start = raw.indexOf("\x1d");
  if (start < 0) return [];
  const end = raw.indexOf("\x1d", start + 1);
  if (end < 0) return [];
  const inner = raw.slice(start + 1, end);
  return inner === "" ? [] : inner.split("\x1f").filter((t) => !t.startsWith("\x01"));
}

/**
 * Checks an order's `expiresAfterMs` as the Rust `engine::expiry::check_ms`: whole ms,
 * 1 ..= `MAX_AHEAD_MS`; `invalid_option` naming `expires_after` otherwise.
 */
export function checkExpiresAfter(ms: unknown): number {
  if (typeof ms !== "number" || !Number.isInteger(ms)) {
    throw new InvalidInputError("invalid_option", `invalid option expires_after: must be whole milliseconds, got ${String(ms)}`);
  }
  if (ms < 1 || ms > MAX_AHEAD_MS) {
    const hint = ms === 0 ? " (leave it out for no expiry)" : "";
    throw new InvalidInputError("invalid_option", `invalid option expires_after: must be 1ms..=10 years (3653d), got ${ms} ms${hint}`);
  }
  return ms;
}

/**
 * What enqueue.lua stores for an order's payload text: `!<ms>!` with its own expiry, then
 * `\x1e<key>\x1e` with a key (src/engine/order_key.rs), then `\x1d<tags>\x1d` with tags
 * (src/engine/tags.rs), then the text (the order of src/engine/message.rs).
 */
export function storedBody(order: NewOrder, payload: string, tokens: string[] = []): string {
  // The order's match tokens under its queue's cancel_on rules are stored after its tags.
  const all = tokens.length > 0 ? [...(order.tags ?? []), ...tokens] : (order.tags ?? []);
  const tagged = all.length > 0 ? `\x1d${all.join("\x1f")}\x1d${payload}` : payload;
  const e = order.expiresAfterMs;
  const k = order.key;
  const keyed = k === undefined || k === null ? tagged : `\x1e${k}\x1e${tagged}`;
  return e === undefined || e === null ? keyed : `!${e}!${keyed}`;
}

/** An order's debounce: both at least 1 ms and at most 10 years, `maxWaitMs >= delayMs`. */
export interface Debounce {
  delayMs: number;
  maxWaitMs: number;
}

const optionErr = (name: string, reason: string) => new InvalidInputError("invalid_option", `invalid option ${name}: ${reason}`);

/** A debounce's `[delayMs, maxWaitMs]`, checked as `Debounce::from_ms` does in Rust. */
export function checkDebounce(d: Debounce): [number, number] {
  const out: number[] = [];
  for (const [name, v] of [
    ["debounce.delay", d?.delayMs],
    ["debounce.max_wait", d?.maxWaitMs],
  ] as [string, unknown][]) {
    if (typeof v !== "number" || !Number.isInteger(v)) throw optionErr(name, "must be an integer number of milliseconds");
    if (v < 0) throw optionErr(name, `must not be negative, got ${v} ms`);
    if (v < 1) throw optionErr(name, "must be at least 1ms");
    if (v > MAX_AHEAD_MS) throw optionErr(name, `${v} ms is more than 10 years`);
    out.push(v);
  }
  const [delay, maxWait] = out as [number, number];
  if (maxWait < delay) throw optionErr("debounce.max_wait", `${maxWait} ms is shorter than the delay ${delay} ms`);
  return [delay, maxWait];
}

/** The per-order time-rules argument of enqueue.lua: `r` for repeat, then the debounce's max wait. */
export function rulesArg(order: NewOrder): string {
  return (order.repeat ? "r" : "") + (order.debounce ? String(order.debounce.maxWaitMs) : "");
}

const dueErr = (reason: string) => new InvalidInputError("invalid_due_time", `invalid due time: ${reason}`);
const delayErr = (reason: string) => new InvalidInputError("invalid_delay", `invalid delay: ${reason}`);

/** An integer as a JS number (exact within 2^53), or null. */
function integer(v: number | bigint): number | null {
  if (typeof v === "bigint") {
    if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER)) {
      return v > 0n ? Number.MAX_SAFE_INTEGER : Number.MIN_SAFE_INTEGER;
    }
    return Number(v);
  }
  if (typeof v === "number" && Number.isFinite(v) && Number.isInteger(v)) {
    return Math.max(Math.min(v, Number.MAX_SAFE_INTEGER), Number.MIN_SAFE_INTEGER);
  }
  return null;
}

/** Rust's `str::trim`: Unicode White_Space at both ends. */
function trimWhite(s: string): string {
  return s.replace(/^[\s\u0085]+|[\s\u0085]+$/gu, "");
}

const RFC3339 =
  /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const NAIVE = /^(\d{4})-(\d{1,2})-(\d{1,2})T(\d{1,2}):(\d{1,2}):(\d{1,2})(\.\d+)?$/;

function daysIn(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  return [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1] ?? 0;
}

/** Parses an absolute time given as text, as the Rust `When::parse_at`: unix ms or RFC 3339 with an offset. */
export function parseAt(text: string): number {
  const t = trimWhite(text);
  if (t !== "" && /^[0-9-]+$/.test(t)) {
    if (!/^-?[0-9]+$/.test(t)) throw dueErr(`${JSON.stringify(t)} is not a valid unix millisecond timestamp`);
    const big = BigInt(t);
    if (big > 9223372036854775807n || big < -9223372036854775808n) {
      throw dueErr(`${JSON.stringify(t)} is not a valid unix millisecond timestamp`);
    }
    if (big < BigInt(YEAR_2000_MS)) {
      throw dueErr(`${t} is before the year 2000: it looks like seconds, not milliseconds`);
    }
    return integer(big) as number;
  }
  const m = RFC3339.exec(t);
  if (m) {
    const [y, mo, d, h, mi, s] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
    const frac = m[7] ?? "";
    const off = m[8] as string;
    const ok =
      mo >= 1 && mo <= 12 && d >= 1 && d <= daysIn(y, mo) && h <= 23 && mi <= 59 && s <= 60;
    let offMin = 0;
    if (off !== "Z" && off !== "z") {
      const oh = Number(off.slice(1, 3));
      const om = Number(off.slice(4, 6));
      if (oh > 23 || om > 59) throw dueErr(`${JSON.stringify(t)} has an invalid UTC offset`);
      offMin = (off[0] === "-" ? -1 : 1) * (oh * 60 + om);
    }
    if (ok) {
      // A leap second (:60) counts as the last millisecond of its minute's 59th second.
      const sec = Math.min(s, 59);
      const ms = s === 60 ? 999 : Number(frac.slice(1, 4).padEnd(3, "0"));
      const d0 = new Date(0);
      d0.setUTCFullYear(y, mo - 1, d);
      d0.setUTCHours(h, mi, sec, ms);
      return d0.getTime() - offMin * 60_000;
    }
    throw dueErr(`${JSON.stringify(t)} is not a valid RFC 3339 time`);
  }
  if (NAIVE.test(t)) throw dueErr(`${JSON.stringify(t)} has no UTC offset and is ambiguous: add Z or +hh:mm`);
  throw dueErr(`${JSON.stringify(t)} is neither RFC 3339 with an offset nor unix milliseconds`);
}

const localErr = (reason: string) => new InvalidInputError("invalid_local_time", `invalid at_local: ${reason}`);
const zoneErr = (reason: string) => new InvalidInputError("invalid_timezone", `invalid timezone: ${reason}`);
const LOCAL = /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?$/;
const WITH_OFFSET = /^(.*)(?:[Zz]|[+-]..:..)$/s;

/** Unix ms of a date-time read as UTC (years 1..9999, unlike `Date.UTC` for years < 100). */
function utcMs(y: number, mo: number, d: number, h: number, mi: number, s: number, ms: number): number {
  const d0 = new Date(0);
  d0.setUTCFullYear(y, mo - 1, d);
  d0.setUTCHours(h, mi, s, ms);
  return d0.getTime();
}

/** `atLocal` as unix ms read as UTC, by the Rust `When::parse_local` rules. */
export function parseLocal(text: unknown): number {
  if (typeof text !== "string") throw localErr(`must be a string, got ${typeof text}`);
  const m = LOCAL.exec(text);
  if (!m) {
    const o = WITH_OFFSET.exec(text);
    if (o && LOCAL.test(o[1] as string)) {
      throw localErr(
        `${rustDebug(text)} has a UTC offset: at_local is a wall-clock time in \`timezone\`, without one (or give due_at instead)`,
      );
    }
    throw localErr(`${rustDebug(text)} is not a local date-time YYYY-MM-DDTHH:MM[:SS[.fff]]`);
  }
  const [y, mo, d, h, mi] = m.slice(1, 6).map(Number) as [number, number, number, number, number];
  const s = Number(m[6] ?? "0");
  const ms = Number((m[7] ?? "").slice(0, 3).padEnd(3, "0"));
  if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > daysIn(y, mo) || h > 23 || mi > 59 || s > 59) {
    throw localErr(`${rustDebug(text)} is not a valid date and time`);
  }
  return utcMs(y, mo, d, h, mi, s, ms);
}

/** The IANA time zone `name` (case-insensitive, trimmed) as Intl names it, as the Rust client looks it up. */
export function lookupTimezone(name: unknown): string {
  if (typeof name === "string") {
    const t = trimWhite(name);
    // Intl also takes offsets (`+01:00`), which are not IANA names.
    if (/^[A-Za-z]/.test(t)) {
      try {
        return new Intl.DateTimeFormat("en-US", { timeZone: t }).resolvedOptions().timeZone;
      } catch {
        // unknown: below
      }
    }
  }
  const shown = typeof name === "string" ? rustDebug(trimWhite(name)) : String(name);
  throw zoneErr(`unknown time zone ${shown} (use an IANA name such as Europe/Berlin, America/New_York or UTC)`);
}

const formats = new Map<string, Intl.DateTimeFormat>();

/** The UTC offset of `zone` at the instant `ms`, in ms. */
function offsetAt(zone: string, ms: number): number {
  let f = formats.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone,
      hourCycle: "h23",
      era: "short",
      year: "numeric",
      month: "numeric",
      day: "numeric",
      hour: "numeric",
      minute: "numeric",
      second: "numeric",
    });
    formats.set(zone, f);
  }
  const at = Math.floor(ms / 1000) * 1000;
  const p: Record<string, string> = {};
  for (const part of f.formatToParts(at)) p[part.type] = part.value;
  let y = Number(p.year);
  if (p.era === "BC" || p.era === "B") y = 1 - y;
  return utcMs(y, Number(p.month), Number(p.day), Number(p.hour), Number(p.minute), Number(p.second), 0) - at;
}

/**
 * The instant of the wall time `naive` (unix ms read as UTC) in `zone`, by the recurring
 * schedules' rules: itself when it exists once, its first occurrence when it happens twice,
 * the first instant after the gap when it does not exist.
 */
export function localToMs(naive: number, zone: string): number {
  const day = 86_400_000;
  const offs = [offsetAt(zone, naive - day), offsetAt(zone, naive + day)];
  const valid = offs.map((o) => naive - o).filter((t) => offsetAt(zone, t) === naive - t);
  if (valid.length > 0) return Math.min(...valid);
  // In a gap: the transition lies between the wall time read with either offset; find its second.
  let lo = Math.floor((naive - Math.max(...offs)) / 1000);
  let hi = Math.ceil((naive - Math.min(...offs)) / 1000);
  const offLo = offsetAt(zone, lo * 1000);
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (offsetAt(zone, mid * 1000) === offLo) lo = mid;
    else hi = mid;
  }
  return hi * 1000;
}

/** The due time in unix ms of `w` given now, by the Rust `When::resolve` rules. */
export function resolveWhen(w: When, nowMs: number): number {
  const hasDelay = w.delayMs !== undefined && w.delayMs !== null;
  const hasAt = w.at !== undefined && w.at !== null;
  const hasLocal = w.atLocal !== undefined && w.atLocal !== null;
  const hasZone = w.timezone !== undefined && w.timezone !== null;
  if (hasLocal && (hasDelay || hasAt)) {
    throw localErr("at_local is a due time of its own: give it without delay_ms or due_at");
  }
  if (hasLocal && !hasZone) throw zoneErr("missing: at_local needs the IANA time zone it is in (e.g. Europe/Berlin)");
  if (hasZone && !hasLocal) throw zoneErr("given without at_local (a due_at carries its own offset)");
  if (!hasLocal && hasDelay === hasAt) throw dueErr("give exactly one of delayMs, at or atLocal");
  let due: number;
  if (hasLocal) {
    const naive = parseLocal(w.atLocal);
    due = localToMs(naive, lookupTimezone(w.timezone));
  } else if (hasDelay) {
    const ms = typeof w.delayMs === "number" || typeof w.delayMs === "bigint" ? integer(w.delayMs) : null;
    if (ms === null) throw delayErr("must be an integer number of milliseconds");
    if (ms < 0) throw delayErr(`must not be negative, got ${ms} ms`);
    if (ms > MAX_AHEAD_MS) throw delayErr(`${ms} ms is more than 10 years`);
    due = nowMs + ms;
  } else {
    const at = w.at;
    if (at instanceof Date) {
      due = at.getTime();
      if (Number.isNaN(due)) throw dueErr("the Date is invalid");
    } else if (typeof at === "string") {
      due = parseAt(at);
    } else if (typeof at === "number" || typeof at === "bigint") {
      const ms = integer(at);
      if (ms === null) throw dueErr("must be an integer number of unix milliseconds");
      if (ms >= 0 && ms < YEAR_2000_MS) {
        throw dueErr(`${ms} is before the year 2000: it looks like seconds, not milliseconds`);
      }
      due = ms;
    } else {
      throw dueErr("at must be a Date, unix milliseconds or RFC 3339 text");
    }
  }
  if (due < 0) throw dueErr(`${due} is before 1970`);
  if (due > nowMs + MAX_AHEAD_MS) throw dueErr(`${due} is more than 10 years ahead`);
  return due;
}

/** The deepest nesting of arrays and objects in JSON text (strings skipped, escapes honoured). */
export function jsonDepth(text: string): number {
  let depth = 0;
  let max = 0;
  let inStr = false;
  let escaped = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inStr) {
      if (escaped) escaped = false;
      else if (c === 0x5c) escaped = true;
      else if (c === 0x22) inStr = false;
      continue;
    }
    if (c === 0x22) inStr = true;
    else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > max) max = depth;
    } else if (c === 0x5d || c === 0x7d) depth = depth > 0 ? depth - 1 : 0;
  }
  return max;
}

const payloadErr = (reason: string) => new InvalidInputError("invalid_payload", `invalid payload: ${reason}`);

/** Checks that `text` is exactly one valid JSON value (as serde_json reads it). */
export function checkJsonText(text: string): void {
  if (typeof text !== "string") throw payloadErr("JSON text must be a string");
  if (hasLoneSurrogate(text)) throw payloadErr("not valid JSON: not valid Unicode (a lone surrogate)");
  // serde_json and JSON.parse agree on what is JSON for this purpose (RFC 8259; numbers of
  // any size are accepted by both: they are only checked, never converted, here).
  try {
    JSON.parse(text);
  } catch (e) {
    throw payloadErr(`not valid JSON: ${(e as Error).message}`);
  }
}

/** Serializes a JS value as JSON: bigints as JSON numbers, `JsonText` embedded as is. */
export function toJsonText(value: unknown): string {
  const seen = new Set<object>();
  const out = stringify(value, seen);
  return out === undefined ? "null" : out;
}

function stringify(v: unknown, seen: Set<object>): string | undefined {
  if (v instanceof JsonText) {
    checkJsonText(v.text);
    return v.text;
  }
  if (v !== null && typeof v === "object" && typeof (v as { toJSON?: unknown }).toJSON === "function") {
    v = (v as { toJSON: () => unknown }).toJSON();
  }
  switch (typeof v) {
    case "bigint":
      return v.toString();
    case "number":
      return Number.isFinite(v) ? JSON.stringify(v) : "null";
    case "string":
      if (hasLoneSurrogate(v)) throw payloadErr("a string holds a lone surrogate (not valid Unicode)");
      return JSON.stringify(v);
    case "boolean":
      return v ? "true" : "false";
    case "undefined":
    case "function":
    case "symbol":
      return undefined;
  }
  if (v === null) return "null";
  const o = v as object;
  if (o instanceof Number || o instanceof String || o instanceof Boolean) {
    return stringify(o.valueOf(), seen);
  }
  if (seen.has(o)) throw payloadErr("the value is circular");
  seen.add(o);
  let out: string;
  if (Array.isArray(o)) {
    out = `[${o.map((x) => stringify(x, seen) ?? "null").join(",")}]`;
  } else {
    const parts: string[] = [];
    for (const k of Object.keys(o)) {
      const s = stringify((o as Record<string, unknown>)[k], seen);
      if (s !== undefined) {
        if (hasLoneSurrogate(k)) throw payloadErr("a key holds a lone surrogate (not valid Unicode)");
        parts.push(`${JSON.stringify(k)}:${s}`);
      }
    }
    out = `{${parts.join(",")}}`;
  }
  seen.delete(o);
  return out;
}

/** The payload text of an order: `payloadJson` as is, or `payload` serialized. */
export function payloadText(order: Pick<NewOrder, "payload" | "payloadJson">): string {
  if (order.payloadJson !== undefined && order.payloadJson !== null) {
    if (order.payload !== undefined) throw payloadErr("give payload or payloadJson, not both");
    checkJsonText(order.payloadJson);
    return order.payloadJson;
  }
  if (order.payload instanceof JsonText) {
    checkJsonText(order.payload.text);
    return order.payload.text;
  }
  return toJsonText(order.payload === undefined ? null : order.payload);
}

/**
 * Checks one order as the Rust `NewOrder::validate` does, once its payload text is known:
 * the id, the payload's size, its depth, the due time, then `expiresAfterMs`, `tags`, then
 * `key`. Returns the due time.
 */
export function checkOrder(order: NewOrder, payload: string, nowMs: number, maxPayloadBytes: number): number {
  checkId(order.id);
  const bytes = Buffer.byteLength(payload, "utf8");
  if (bytes > maxPayloadBytes) {
    throw new InvalidInputError(
      "payload_too_large",
      `payload too large: ${bytes} bytes, the limit is ${maxPayloadBytes} bytes`,
    );
  }
  const depth = jsonDepth(payload);
  if (depth > MAX_PAYLOAD_DEPTH) {
    throw payloadErr(`nested ${depth} levels deep; at most ${MAX_PAYLOAD_DEPTH} levels of arrays and objects`);
  }
  let due: number;
  if (order.debounce !== undefined && order.debounce !== null) {
    const [delay] = checkDebounce(order.debounce);
    for (const f of [order.delayMs, order.at, order.atLocal, order.timezone]) {
      if (f !== undefined && f !== null) {
        throw optionErr("debounce", "a debounced order is due its delay after each call: give no other due time");
      }
    }
    due = resolveWhen({ delayMs: delay }, nowMs);
  } else {
    due = resolveWhen(order, nowMs);
  }
  if (order.expiresAfterMs !== undefined && order.expiresAfterMs !== null) checkExpiresAfter(order.expiresAfterMs);
  checkTags(order.tags);
  if (order.key !== undefined && order.key !== null) checkKey(order.key);
  checkCancelOn(order.cancelOn);
  return due;
}

/** Most rules per order (or queue), match paths per rule, the longest path and `remember` (src/engine/events.rs). */
export const MAX_RULES = 8;
export const MAX_MATCH = 4;
export const MAX_PATH_LEN = 128;
export const MAX_REMEMBER_MS = 7 * 24 * 3600 * 1000;
/** Most distinct rules a queue's orders may declare (`MAX_ORDER_RULES`). */
export const MAX_ORDER_RULES = 64;
/** A rule's `remember` when it gives none: 15 min (`DEFAULT_REMEMBER_MS`). */
export const DEFAULT_REMEMBER_MS = 900_000;

/** A checked rule: event, paths, remember (ms). */
export type OwnRule = [string, string[], number];

/**
 * Checks an order's own rules as the Rust `events::validate_rules` checks a queue's;
 * `invalid_option` naming `cancel_on` otherwise. Returns them as (event, paths, remember).
 */
export function checkCancelOn(rules: unknown): OwnRule[] {
  const bad = (reason: string) => optionErr("cancel_on", reason);
  if (rules === undefined || rules === null) return [];
  if (!Array.isArray(rules)) throw bad("must be an array of rules {event, match, rememberMs}");
  if (rules.length > MAX_RULES) throw bad(`at most ${MAX_RULES} rules per queue, got ${rules.length}`);
  const out: OwnRule[] = [];
  for (const r of rules as unknown[]) {
    if (typeof r !== "object" || r === null || Array.isArray(r)) throw bad("each rule must be an object {event, match, rememberMs}");
    const o = r as Record<string, unknown>;
    const unknown = Object.keys(o).find((k) => !["event", "match", "rememberMs"].includes(k));
    if (unknown !== undefined) throw bad(`unknown rule field ${JSON.stringify(unknown)} (event, match, rememberMs)`);
    const event = o.event;
    if (typeof event !== "string") throw bad("a rule needs an event name (a string)");
    if (event === "") throw bad("the event name must not be empty");
    if (Buffer.byteLength(event, "utf8") > MAX_EVENT_LEN) throw bad(`the event name must be at most ${MAX_EVENT_LEN} bytes`);
    if (!/^[A-Za-z0-9._:/-]+$/.test(event)) throw bad("the event name holds a character outside A-Z a-z 0-9 . _ - : /");
    const m = o.match ?? [];
    const paths = typeof m === "string" ? [m] : m;
    if (!Array.isArray(paths) || !paths.every((x) => typeof x === "string")) throw bad("match must be a field path or an array of them");
    if (paths.length === 0) throw bad(`the rule for ${event} has no match field (it would cancel every order)`);
    if (paths.length > MAX_MATCH) throw bad(`at most ${MAX_MATCH} match fields per rule`);
    paths.forEach((x: string, i: number) => {
      if (x === "" || x.length > MAX_PATH_LEN) throw bad(`match path ${JSON.stringify(x)} must be 1..=${MAX_PATH_LEN} bytes`);
      if (!/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/.test(x)) {
        throw bad(`match path ${JSON.stringify(x)} is not a JSON field path (dotted names of A-Z a-z 0-9 _ -, such as order_id or customer.id)`);
      }
      if (paths.slice(0, i).includes(x)) throw bad(`match path ${JSON.stringify(x)} is given twice`);
    });
    const remember = o.rememberMs ?? DEFAULT_REMEMBER_MS;
    if (typeof remember !== "number" || !Number.isInteger(remember) || remember < 1 || remember > MAX_REMEMBER_MS) {
      throw bad("remember must be 1 ms..=7 days");
    }
    if (out.some(([e, p]) => e === event && p.length === paths.length && p.every((x, i) => x === paths[i]))) {
      throw bad(`the rule for ${event} is given twice`);
    }
    out.push([event, [...(paths as string[])], remember]);
  }
  return out;
}

/** A rule an order declares, as the queue's record keeps it: `order_rule:<rule JSON>`, byte for byte the Rust client's. */
export function orderRuleField([event, paths, remember]: OwnRule): string {
  return `order_rule:${JSON.stringify({ event, match: paths, remember_ms: remember })}`;
}

/** The match tokens of an order's payload under its own rules: the event part carries the rule's window, `<event>@<remember ms>`. */
export function ownTokens(own: OwnRule[], payload: string): string[] {
  return orderTokens(own.map(([event, match, remember]) => ({ event: `${event}@${remember}`, match })), payload);
}

/**
 * Splits a stored value `"<enqueued_ms>:<json>"` into its parts. An order scheduled in a
 * trace context (a Rust producer, or `delayq serve` given `traceparent`) stores
 * `"<enqueued_ms>:~<traceparent>[;<tracestate>]~<json>"`: the context is left out, so the
 * payload reads back byte for byte (`~` never starts a JSON text).
 */
export function decodeStored(raw: string): { enqueuedAtMs: number | null; json: string; key?: string } {
  const i = raw.indexOf(":");
  if (i >= 0) {
    const ms = raw.slice(0, i);
    if (/^[+-]?[0-9]+$/.test(ms)) {
      const big = BigInt(ms);
      if (big <= 9223372036854775807n && big >= -9223372036854775808n) {
        let json = raw.slice(i + 1);
        // An order's expires_after ("!<ms>!", src/engine/expiry.rs) comes first.
        const exp = /^!([1-9][0-9]*)!/.exec(json);
        if (exp) json = json.slice(exp[0].length);
        // Then its key ("\x1e<key>\x1e", src/engine/order_key.rs).
        let key: string | undefined;
        if (json.startsWith("\x1e")) {
          const end = json.indexOf("\x1e", 1);
          if (end > 1) {
            key = json.slice(1, end);
            json = json.slice(end + 1);
          }
        }
        // Then its tags ("\x1d<t1>\x1f<t2>\x1d", src/engine/tags.rs).
        if (json.startsWith("\x1d")) {
          const end = json.indexOf("\x1d", 1);
          if (end > 0) json = json.slice(end + 1);
        }
        if (json.startsWith("~")) {
          const end = json.indexOf("~", 1);
          if (end > 0) json = json.slice(end + 1);
        }
        return key === undefined ? { enqueuedAtMs: Number(big), json } : { enqueuedAtMs: Number(big), json, key };
      }
    }
  }
  return { enqueuedAtMs: null, json: raw };
}

/** Longest event name or event id, bytes (src/engine/events.rs). */
export const MAX_EVENT_LEN = 128;

/**
 * Checks an event as Client::post_event does: `name` (1..=128 bytes of `A-Z a-z 0-9 . _ -
 * : /`), `data` (a JSON object), `id` (1..=128 bytes without control characters); the error
 * names the field.
 */
export function checkEvent(name: unknown, data: unknown, id: unknown): void {
  const bad = (field: string, reason: string) => new InvalidInputError("invalid_option", `invalid option ${field}: ${reason}`);
  if (typeof name !== "string" || name === "") throw bad("name", "the event name must not be empty");
  const n = Buffer.byteLength(name, "utf8");
  if (n > MAX_EVENT_LEN) throw bad("name", `the event name must be at most ${MAX_EVENT_LEN} bytes, got ${n}`);
  if (!/^[A-Za-z0-9._:/-]+$/.test(name)) throw bad("name", "the event name holds a character outside A-Z a-z 0-9 . _ - : /");
  if (id !== undefined && id !== null) {
    if (typeof id !== "string" || id === "" || Buffer.byteLength(id, "utf8") > MAX_EVENT_LEN || /[\u0000-\u001f\u007f-\u009f]/.test(id)) {
      throw bad("id", "must be 1..=128 bytes without control characters");
    }
  }
  if (typeof data !== "object" || data === null || Array.isArray(data)) throw bad("data", "must be a JSON object");
}

/**
 * The match token of `data` under a rule (`null` when a path holds no scalar):
 * `"\x01<event> {"<path>":<value JSON>,...}"`, byte for byte the Rust client's. A value
 * longer than 256 bytes gives `null`, or with `strict` (an order's payload, as
 * `CancelRule::token`) is refused naming `cancel_on`.
 */
export function eventToken(event: string, paths: string[], data: unknown, strict = false): string | null {
  const parts: string[] = [];
  for (const p of paths) {
    let v: unknown = data;
    for (const seg of p.split(".")) {
      if (typeof v !== "object" || v === null || Array.isArray(v) || !Object.hasOwn(v, seg)) return null;
      v = (v as Record<string, unknown>)[seg];
    }
    if (v === null || typeof v === "object" || v === undefined) return null;
    const text = JSON.stringify(v);
    if (text === undefined) return null;
    if (Buffer.byteLength(text, "utf8") > 256) {
      if (strict) throw optionErr("cancel_on", `the value at ${p} is longer than 256 bytes`);
      return null;
    }
    parts.push(`${JSON.stringify(p)}:${text}`);
  }
  return `\x01${event} {${parts.join(",")}}`;
}

/** A queue's cancel-on-event rule as its registry record stores it (field `cancel_on`). */
export interface StoredRule {
  event?: string;
  match?: string[];
  remember_ms?: number;
}

/**
 * The match tokens of an order's payload (JSON text) under its queue's rules, stored among
 * its tags, as the Rust client computes them (the same code as postEvent's).
 */
export function orderTokens(rules: StoredRule[], payload: string): string[] {
  if (rules.length === 0) return [];
  let doc: unknown;
  try {
    doc = JSON.parse(payload);
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const r of rules) {
    if (typeof r?.event !== "string") continue;
    const t = eventToken(r.event, r.match ?? [], doc, true);
    if (t !== null) out.push(t);
  }
  return out;
}

/** A registry record's `cancel_on` field (`{"v": version, "rules": [...]}`) as (version, rules); unreadable: no rules. */
export function storedRules(text: string | null | undefined): { v: string; rules: StoredRule[] } {
  if (text === null || text === undefined) return { v: "", rules: [] };
  try {
    const s = JSON.parse(text) as { v?: unknown; rules?: unknown };
    if (typeof s?.v === "string" && Array.isArray(s.rules)) return { v: s.v, rules: s.rules as StoredRule[] };
  } catch {
    // A value this version cannot read counts as no rules (as the Rust client reads it).
  }
  return { v: "", rules: [] };
}
