// Consumer: pulls due orders of one queue's group from `delayq serve` over HTTP
// (`POST /v1/queues/{queue}/groups/{group}:receive|:ack|:nack|:extend`), runs a handler on
// each and settles it by its receipt. HTTP only: the consumer needs no Redis access.

import http from "node:http";
import https from "node:https";
import { DelayqError } from "./errors.js";
import type { Priority } from "./message.js";

/** The consumer's settings. */
export interface ConsumerOptions {
  /** Where `delayq serve` answers, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** An API token, sent as `Authorization: Bearer <token>` (none: an open API). */
  token?: string;
  /** The registered queue. */
  queue: string;
  /** The consumer group (joined on its first receive). */
  group: string;
  /** Each delivery's lease in ms (default 30000; the server checks the range). */
  leaseMs?: number;
  /** Every HTTP call's timeout in ms (default 10000). */
  timeoutMs?: number;
}

/** One leased delivery, as `:receive` answers it. */
export interface PullDelivery {
  /** The order id. */
  id: string;
  /** The payload, parsed (`JSON.parse`; see `payloadJson` for numbers beyond a double). */
  payload: unknown;
  /** The payload's JSON text, byte for byte as scheduled. */
  payloadJson: string;
  priority: Priority;
  /** 1 for the first delivery, 2 for the first retry, ... */
  attempt: number;
  dueAtMs: number;
  dispatchedAtMs: number;
  enqueuedAtMs?: number;
  /** The W3C trace context of the schedule call, when it had one. */
  traceparent?: string;
  tracestate?: string;
  /** The order's key (issue 42), when it has one. */
  key?: string;
  /** Settles this delivery while its lease holds (replaced by `extend`). */
  receipt: string;
  /** When the lease runs out (server time, ms). */
  leaseUntilMs: number;
}

/** What `nack` does with a delivery. */
export interface NackOptions {
  /** Retry after this many ms (default: the group's backoff). Not with `dead`. */
  retryInMs?: number;
  /** Straight to the dead letters, not retried. */
  dead?: boolean;
  /** Why: kept as the delivery's last error (the dead letter's text). */
  error?: string;
}

/** One receipt's result of `ack`. */
export type AckStatus = "acked" | "lease_lost";

/** One receipt's result of `extend`: the new receipt when extended. */
export type ExtendResult = { status: "extended"; receipt: string } | { status: "lease_lost" };

/** How `run` consumes. */
export interface RunOptions {
  /** Handlers running at once (default 1). */
  concurrency?: number;
  /**
   * Stops the loop: no new receive (the one in flight returns within `waitMs` and its
   * deliveries are handled); running handlers get `graceMs` to finish and be settled.
   */
  signal?: AbortSignal;
  /**
   * How long each receive waits on the server for an order, in ms (a long poll, default
   * 5000, at most 20000): the server answers as soon as one can be received, so the loop
   * makes no pause of its own between receives.
   */
  waitMs?: number;
  /**
   * After `signal` aborts, how long running handlers get to finish, in ms (default 30000).
   * Past it `run` resolves; the leases of handlers still running are no longer extended and
   * are left to run out (not nacked: the handler may still complete its work), so another
   * consumer gets those orders at their next attempt.
   */
  graceMs?: number;
  /** Extend the lease of a running handler's delivery every `leaseMs / 2` (default true). */
  extendLeases?: boolean;
  /** The retry delay of a failed handler's nack (default: the group's backoff). */
  retryInMs?: number;
  /** Told of every failure the loop survives (a lost lease, a refused ack, an unreachable server). Default: `console.error`. */
  onError?: (error: unknown, delivery?: PullDelivery) => void;
}

/** A handler of one delivery: resolving acks it, throwing nacks it with the error's message. */
export type Handler = (delivery: PullDelivery) => unknown | Promise<unknown>;

/** The receipt's lease ran out and the delivery was taken over (or it was settled already); nothing was changed. */
export class LeaseLostError extends DelayqError {
  constructor(message: string) {
    super("lease_lost", message);
  }
}

/**
 * `delayq serve` refused a call (`status` and the API's `error.code` as `code`), or could not
 * be reached (`code` `unavailable`, `status` undefined) or did not answer in time (`code`
 * `timeout`: an ack or nack may then have been applied).
 */
export class ConsumerApiError extends DelayqError {
  /** The HTTP status, when the server answered. */
  readonly status?: number;
  constructor(code: string, message: string, status?: number, options?: { cause?: unknown }) {
    super(code, message, options);
    if (status !== undefined) this.status = status;
  }
}

type Settleable = PullDelivery | string;

/** Pulls one group of one queue from `delayq serve`. */
export class Consumer {
  readonly queue: string;
  readonly group: string;
  readonly leaseMs: number;
  readonly timeoutMs: number;
  private readonly base: string;
  private readonly token: string | undefined;
  /** Keeps this consumer's connections open between calls (one per call in flight). */
  private readonly agent: http.Agent;

  constructor(options: ConsumerOptions) {
    const { baseUrl, token, queue, group, leaseMs = 30_000, timeoutMs = 10_000 } = options;
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new DelayqError("invalid_option", `baseUrl: not a URL: ${JSON.stringify(String(baseUrl))}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new DelayqError("invalid_option", `baseUrl: ${url.protocol} is not http: or https:`);
    }
    for (const [name, v] of [["queue", queue], ["group", group]] as const) {
      if (typeof v !== "string" || v.length === 0) {
        throw new DelayqError("invalid_option", `${name}: must be a non-empty string`);
      }
    }
    for (const [name, v] of [["leaseMs", leaseMs], ["timeoutMs", timeoutMs]] as const) {
      if (!Number.isSafeInteger(v) || v <= 0) {
        throw new DelayqError("invalid_option", `${name}: must be a positive whole number of ms, not ${String(v)}`);
      }
    }
    if (token !== undefined && (typeof token !== "string" || token.length === 0)) {
      throw new DelayqError("invalid_option", "token: must be a non-empty string when given");
    }
    this.base = `${url.origin}${url.pathname.replace(/\/+$/, "")}`;
    this.token = token;
    this.queue = queue;
    this.group = group;
    this.leaseMs = leaseMs;
    this.timeoutMs = timeoutMs;
    // An idle connection is closed after IDLE_CLOSE_MS, before the server's idle timeout
    // (default 60 s) could close it under a new call; idle ones never keep the process up.
    const agentOptions = { keepAlive: true, timeout: IDLE_CLOSE_MS };
    this.agent = url.protocol === "https:" ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  }

  /**
   * Up to `max` due deliveries, each leased for `leaseMs`. When nothing is due the server
   * waits up to `waitMs` (a long poll, 0..=20000) for an order and answers as soon as one
   * can be received; empty when none came (or the server is shutting down).
   */
  async receive(max = 10, leaseMs = this.leaseMs, waitMs = 0): Promise<PullDelivery[]> {
    const body: Record<string, unknown> = { max, lease_ms: leaseMs };
    if (waitMs > 0) body.wait_ms = waitMs;
    const text = await this.call("receive", body, waitMs > 0 ? waitMs : 0);
    return parseDeliveries(text);
  }

  /**
   * Acknowledges deliveries (or their receipts): one status per receipt, in order. Throws
   * `LeaseLostError` when no receipt's lease holds any more.
   */
  async ack(deliveriesOrReceipts: Settleable | Settleable[]): Promise<AckStatus[]> {
    const receipts = receiptsOf(deliveriesOrReceipts);
    if (receipts.length === 0) return [];
    const body = JSON.parse(await this.call("ack", { receipts })) as { results: { status: AckStatus }[] };
    return body.results.map((r) => r.status);
  }

  /** Gives a delivery back: retried (after `retryInMs` or the group's backoff) or dead-lettered. */
  async nack(delivery: Settleable, options: NackOptions = {}): Promise<void> {
    const body: Record<string, unknown> = { receipt: receiptOf(delivery) };
    if (options.retryInMs !== undefined) body.retry_in_ms = options.retryInMs;
    if (options.dead !== undefined) body.dead = options.dead;
    if (options.error !== undefined) body.error = options.error;
    await this.call("nack", body);
  }

  /**
   * Extends the leases of deliveries (or receipts) to `leaseMs` from now: one result per
   * receipt, each extended one with its new receipt (a delivery passed in gets it too).
   * Throws `LeaseLostError` when no receipt's lease holds any more.
   */
  async extend(deliveriesOrReceipts: Settleable | Settleable[], leaseMs = this.leaseMs): Promise<ExtendResult[]> {
    const items = Array.isArray(deliveriesOrReceipts) ? deliveriesOrReceipts : [deliveriesOrReceipts];
    const receipts = receiptsOf(items);
    if (receipts.length === 0) return [];
    const body = JSON.parse(await this.call("extend", { receipts, lease_ms: leaseMs })) as { results: ExtendResult[] };
    body.results.forEach((r, i) => {
      const item = items[i];
      if (r.status === "extended" && typeof item === "object") item.receipt = r.receipt;
    });
    return body.results;
  }

  /**
   * Receives and handles deliveries until `signal` aborts: each delivery is acked when
   * `handler` resolves (successes finishing within 2 ms of each other share one `:ack`
   * call, up to 100) and nacked with the error's message when it throws. Each receive is
   * a long poll of `waitMs`; the loop pauses (50 ms doubling to 5 s) only while the server
   * is unreachable. A running handler's lease is extended at half of it. Resolves once
   * stopped and every running handler is settled (or `graceMs` passed); rejects on a
   * refusal that repeating cannot fix (a 4xx of `receive`, e.g. a wrong token, an unknown
   * queue or a group of another kind).
   */
  async run(handler: Handler, options: RunOptions = {}): Promise<void> {
    const { concurrency = 1, signal, waitMs = 5000, graceMs = 30_000, retryInMs, extendLeases = true } = options;
    const onError = options.onError ?? ((e: unknown) => console.error(`delayq consumer ${this.queue}/${this.group}:`, e));
    if (!Number.isSafeInteger(concurrency) || concurrency < 1) {
      throw new DelayqError("invalid_option", `concurrency: must be a whole number of at least 1, not ${String(concurrency)}`);
    }
    const running = new Set<Promise<void>>();
    // Set once the grace after a stop ran out: leases are no longer extended or settled.
    let abandoned = false;
    const acks = new AckBatch(this);
    const settle = async (d: PullDelivery): Promise<void> => {
      let failure: unknown;
      let ok = false;
      // A long handler keeps its lease: extended at half of it, the delivery taking each new
      // receipt; the settling call waits for an extension in flight (it spends the receipt).
      let extending: Promise<unknown> | undefined;
      const timer = extendLeases
        ? setInterval(() => {
            if (abandoned) return clearInterval(timer);
            extending ??= this.extend(d)
              .catch((e) => onError(e, d))
              .finally(() => (extending = undefined));
          }, Math.max(1, Math.floor(this.leaseMs / 2)))
        : undefined;
      try {
        await handler(d);
        ok = true;
      } catch (e) {
        failure = e;
      } finally {
        clearInterval(timer);
        await extending;
      }
      if (abandoned) return;
      try {
        if (ok) await acks.ack(d);
        else await this.nack(d, { error: errorText(failure), ...(retryInMs === undefined ? {} : { retryInMs }) });
      } catch (e) {
        onError(e, d);
      }
    };
    let failurePause = 0;
    try {
      while (!signal?.aborted) {
        const free = concurrency - running.size;
        if (free === 0) {
          await Promise.race(running);
          continue;
        }
        let batch: PullDelivery[];
        try {
          batch = await this.receive(free, this.leaseMs, waitMs);
        } catch (e) {
          const status = (e as ConsumerApiError).status;
          if (status !== undefined && status >= 400 && status < 500 && status !== 429) throw e;
          onError(e);
          failurePause = Math.min(failurePause === 0 ? 50 : failurePause * 2, 5000);
          await pause(failurePause, signal);
          continue;
        }
        failurePause = 0;
        for (const d of batch) {
          const p: Promise<void> = settle(d).finally(() => running.delete(p));
          running.add(p);
        }
      }
    } finally {
      const grace = new AbortController();
      await Promise.race([Promise.all(running), pause(graceMs, grace.signal)]);
      grace.abort();
      abandoned = running.size > 0;
    }
  }

  /** One POST of `action`: the answer's text, or the error. */
  private async call(action: string, body: unknown, waitMs = 0): Promise<string> {
    const url = `${this.base}/v1/queues/${encodeURIComponent(this.queue)}/groups/${encodeURIComponent(this.group)}:${action}`;
    const what = `POST ${url}`;
    const payload = JSON.stringify(body);
    const headers: Record<string, string | number> = { "content-type": "application/json", "content-length": Buffer.byteLength(payload) };
    if (this.token !== undefined) headers.authorization = `Bearer ${this.token}`;
    let status: number;
    let text: string;
    try {
      ({ status, text } = await post(url, this.agent, headers, payload, this.timeoutMs + waitMs));
    } catch (e) {
      const timedOut = (e as { name?: string })?.name === "TimeoutError";
      const reason = timedOut
        ? `no answer within ${this.timeoutMs} ms (an ack or nack may have been applied)`
        : `${errorText(e)}${causeText(e)}`;
      throw new ConsumerApiError(timedOut ? "timeout" : "unavailable", this.scrub(`${what}: ${reason}`));
    }
    if (status >= 200 && status < 300) return text;
    let code = `http_${status}`;
    let message = text.slice(0, 500);
    try {
      const err = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown } }).error;
      if (typeof err?.code === "string") code = err.code;
      if (typeof err?.message === "string") message = err.message;
    } catch {
      // Not the API's envelope (a proxy's page): its text, shortened.
    }
    if (status === 409 && code === "lease_lost") throw new LeaseLostError(this.scrub(`${what}: ${message}`));
    throw new ConsumerApiError(code, this.scrub(`${what}: ${status} ${code}: ${message}`), status);
  }

  /** `text` with the token cut out (it never reaches an error). */
  private scrub(text: string): string {
    return this.token === undefined ? text : text.split(this.token).join("<token>");
  }
}

/** How long a connection may stay idle before the consumer closes it, in ms. */
const IDLE_CLOSE_MS = 4000;

/**
 * POSTs `payload` to `url` over `agent`'s kept-alive connections (`node:http`, not `fetch`:
 * a quarter of the CPU per call): the status and the body as text. Rejects with an error
 * named `TimeoutError` when the whole exchange takes over `timeoutMs`, else with the
 * socket's error.
 */
function post(url: string, agent: http.Agent, headers: Record<string, string | number>, payload: string, timeoutMs: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const request = url.startsWith("https:") ? https.request : http.request;
    const req = request(url, { method: "POST", agent, headers }, (res) => {
      res.setEncoding("utf8");
      let text = "";
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, text });
      });
      res.on("error", fail);
    });
    function fail(e: unknown): void {
      clearTimeout(timer);
      reject(e);
    }
    const timer = setTimeout(() => {
      const e = new Error(`no answer within ${timeoutMs} ms`);
      e.name = "TimeoutError";
      req.destroy(e);
    }, timeoutMs);
    req.on("error", fail);
    req.end(payload);
  });
}

/** Most deliveries `run` acknowledges in one `:ack`. */
const ACK_BATCH = 100;
/** How long `run` holds a success for others to share its `:ack`, in ms. */
const ACK_LINGER_MS = 2;

/**
 * `run`'s acknowledgements: the successes of handlers finishing within `ACK_LINGER_MS` of
 * each other (or `ACK_BATCH` of them) share one `:ack` call, as the server's workers batch
 * theirs; each caller learns its own delivery's result.
 */
class AckBatch {
  private pending: { d: PullDelivery; resolve: () => void; reject: (e: unknown) => void }[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;
  constructor(private readonly consumer: Consumer) {}

  /** Resolves once `d` is acked; rejects with `LeaseLostError` when its lease was lost, or the call's error. */
  ack(d: PullDelivery): Promise<void> {
    return new Promise((resolve, reject) => {
      this.pending.push({ d, resolve, reject });
      if (this.pending.length >= ACK_BATCH) this.flush();
      else this.timer ??= setTimeout(() => this.flush(), ACK_LINGER_MS);
    });
  }

  private flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    const batch = this.pending.splice(0);
    if (batch.length === 0) return;
    this.consumer.ack(batch.map((x) => x.d)).then(
      (statuses) =>
        batch.forEach((x, i) => {
          if (statuses[i] === "acked") x.resolve();
          else x.reject(new LeaseLostError(`ack of ${x.d.id}: the receipt's lease ran out and the delivery was taken over (or it was settled already)`));
        }),
      (e: unknown) => batch.forEach((x) => x.reject(e)),
    );
  }
}

function receiptOf(x: Settleable): string {
  const r = typeof x === "string" ? x : x?.receipt;
  if (typeof r !== "string" || r.length === 0) {
    throw new DelayqError("invalid_option", "receipt: pass a delivery from receive() or its receipt string");
  }
  return r;
}

function receiptsOf(x: Settleable | Settleable[]): string[] {
  return (Array.isArray(x) ? x : [x]).map(receiptOf);
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.message || e.name;
  return String(e);
}

function causeText(e: unknown): string {
  const c = (e as { cause?: unknown })?.cause;
  return c === undefined ? "" : ` (${errorText(c)})`;
}

/** Waits `ms`, or less when `signal` aborts. */
function pause(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * The deliveries of a `:receive` answer, each payload kept as its exact JSON text: the
 * answer is parsed once (`JSON.parse`) for its fields, and walked once, character code by
 * character code, to cut each payload's span out of the text (parsing would round numbers
 * beyond a double).
 */
export function parseDeliveries(text: string): PullDelivery[] {
  let body: { deliveries?: unknown };
  try {
    body = JSON.parse(text) as { deliveries?: unknown };
  } catch {
    throw new DelayqError("internal", `unexpected :receive answer: ${text.slice(0, 200)}`);
  }
  const list = body?.deliveries;
  if (!Array.isArray(list)) throw new DelayqError("internal", `unexpected :receive answer: ${text.slice(0, 200)}`);
  const spans = payloadSpans(text);
  if (spans.length !== list.length) throw new DelayqError("internal", "a :receive answer whose deliveries do not each have one payload");
  return list.map((x: Record<string, unknown>, i) => {
    const [a, b] = spans[i]!;
    const d: PullDelivery = {
      id: x.id as string,
      payload: x.payload,
      payloadJson: text.slice(a, b),
      priority: x.priority as Priority,
      attempt: x.attempt as number,
      dueAtMs: x.due_at_ms as number,
      dispatchedAtMs: x.dispatched_at_ms as number,
      receipt: x.receipt as string,
      leaseUntilMs: x.lease_until_ms as number,
    };
    if (typeof x.enqueued_at_ms === "number") d.enqueuedAtMs = x.enqueued_at_ms;
    if (typeof x.traceparent === "string") d.traceparent = x.traceparent;
    if (typeof x.tracestate === "string") d.tracestate = x.tracestate;
    if (typeof x.key === "string") d.key = x.key;
    return d;
  });
}

type Span = [number, number];

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const COMMA = 0x2c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;

function isWs(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
}

function skipWs(text: string, i: number): number {
  while (i < text.length && isWs(text.charCodeAt(i))) i++;
  return i;
}

/** The index after the string whose opening quote is at `i`. */
function stringEnd(text: string, i: number): number {
  for (let j = i + 1; j < text.length; j++) {
    const c = text.charCodeAt(j);
    if (c === BACKSLASH) j++;
    else if (c === QUOTE) return j + 1;
  }
  throw new DelayqError("internal", "unexpected end of a :receive answer");
}

/** The end of the JSON value starting at `i` (after whitespace): [start, end). */
function valueSpan(text: string, i: number): Span {
  const start = skipWs(text, i);
  const c = text.charCodeAt(start);
  if (c === QUOTE) return [start, stringEnd(text, start)];
  if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
    let depth = 0;
    for (let j = start; j < text.length; j++) {
      const ch = text.charCodeAt(j);
      if (ch === QUOTE) j = stringEnd(text, j) - 1;
      else if (ch === OPEN_OBJECT || ch === OPEN_ARRAY) depth++;
      else if ((ch === CLOSE_OBJECT || ch === CLOSE_ARRAY) && --depth === 0) return [start, j + 1];
    }
    throw new DelayqError("internal", "unexpected end of a :receive answer");
  }
  let j = start;
  for (; j < text.length; j++) {
    const ch = text.charCodeAt(j);
    if (ch === COMMA || ch === CLOSE_OBJECT || ch === CLOSE_ARRAY || isWs(ch)) break;
  }
  if (j === start) throw new DelayqError("internal", `unexpected :receive answer at ${start}`);
  return [start, j];
}

/**
 * Calls `each(key, valueStart)` for the members of the object at `i` (after whitespace);
 * `each` returns where the value ends. Returns the index after the object.
 */
function walkObject(text: string, i: number, each: (key: string, at: number) => number): number {
  let j = skipWs(text, i);
  if (text.charCodeAt(j) !== OPEN_OBJECT) throw new DelayqError("internal", `expected an object in a :receive answer at ${j}`);
  j = skipWs(text, j + 1);
  if (text.charCodeAt(j) === CLOSE_OBJECT) return j + 1;
  for (;;) {
    if (text.charCodeAt(j) !== QUOTE) throw new DelayqError("internal", `expected a key in a :receive answer at ${j}`);
    const keyEnd = stringEnd(text, j);
    const key = text.slice(j + 1, keyEnd - 1);
    j = skipWs(text, keyEnd);
    if (text.charCodeAt(j) !== COLON) throw new DelayqError("internal", `expected ':' in a :receive answer at ${j}`);
    j = skipWs(text, each(key, skipWs(text, j + 1)));
    const c = text.charCodeAt(j);
    if (c === CLOSE_OBJECT) return j + 1;
    if (c !== COMMA) throw new DelayqError("internal", `expected ',' in a :receive answer at ${j}`);
    j = skipWs(text, j + 1);
  }
}

/** The span of each delivery's `payload` in a `:receive` answer, in order: one pass. */
function payloadSpans(text: string): Span[] {
  const out: Span[] = [];
  walkObject(text, 0, (key, at) => {
    // A key with an escape is no key the server sends.
    if (key !== "deliveries") return valueSpan(text, at)[1];
    if (text.charCodeAt(at) !== OPEN_ARRAY) throw new DelayqError("internal", `expected an array in a :receive answer at ${at}`);
    let j = skipWs(text, at + 1);
    if (text.charCodeAt(j) === CLOSE_ARRAY) return j + 1;
    for (;;) {
      let payload: Span | undefined;
      j = walkObject(text, j, (k, v) => {
        const span = valueSpan(text, v);
        if (k === "payload") payload = span;
        return span[1];
      });
      if (payload === undefined) throw new DelayqError("internal", "a delivery without a payload in a :receive answer");
      out.push(payload);
      j = skipWs(text, j);
      const c = text.charCodeAt(j);
      if (c === CLOSE_ARRAY) return j + 1;
      if (c !== COMMA) throw new DelayqError("internal", `expected ',' in a :receive answer at ${j}`);
      j++;
    }
  });
  return out;
}
