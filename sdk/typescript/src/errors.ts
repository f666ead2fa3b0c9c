// Errors: the same kinds as the Rust client's `Error`, each with the stable `code` that the
// HTTP API puts in `error.code`.

/** The stable codes of rejected input: `InvalidInput::code()` of the Rust crate. */
export type InvalidInputCode =
  | "invalid_queue"
  | "invalid_namespace"
  | "invalid_id"
  | "invalid_name"
  | "invalid_payload"
  | "payload_too_large"
  | "invalid_delay"
  | "invalid_due_time"
  | "invalid_priority"
  | "invalid_timezone"
  | "invalid_local_time"
  | "invalid_redis_url"
  | "invalid_option"
  | "invalid_body"
  | "batch_too_large";

/** Whether a failed write may have been applied. */
export type WriteOutcome = "not_applied" | "unknown";

/** Every error this package throws. */
export class DelayqError extends Error {
  /** The stable machine-readable code (the HTTP API's `error.code` for the same failure). */
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
  /** Whether a failed write may have been applied (input errors: never). */
  get writeOutcome(): WriteOutcome {
    return "not_applied";
  }
}

/**
 * The caller passed something invalid; nothing was sent to Redis. `code` is one of the
 * stable codes; `index` is the order's position when one order of a batch was refused (the
 * whole batch is refused then).
 */
export class InvalidInputError extends DelayqError {
  declare readonly code: InvalidInputCode;
  /** The position of the refused order in the batch (scheduleMany only). */
  readonly index?: number;
  /** Why, without the batch position. */
  readonly reason: string;
  constructor(code: InvalidInputCode, reason: string, index?: number) {
    super(code, index === undefined ? reason : `message ${index}: ${reason}`);
    this.reason = reason;
    if (index !== undefined) this.index = index;
  }
  /** The same error, placed at `index` of a batch. */
  inBatch(index: number): InvalidInputError {
    return new InvalidInputError(this.code, this.reason, index);
  }
}

/** The queue is not registered (create it first: `delayq queue create <queue>`). Nothing was written. */
export class QueueNotFoundError extends DelayqError {
  readonly queue: string;
  constructor(queue: string, detail?: string) {
    super(
      "queue_not_found",
      detail === undefined
        ? `queue ${JSON.stringify(queue)} does not exist (create it first: delayq queue create ${queue})`
        : `queue ${JSON.stringify(queue)} cannot take orders: ${detail}`,
    );
    this.queue = queue;
  }
}

/**
 * A durable schedule was not confirmed by enough replicas in time, or its connection broke
 * before they answered. The order may be on the leader and may still fire; repeating the
 * schedule is safe (idempotent).
 */
export class NotReplicatedError extends DelayqError {
  readonly acked: number;
  readonly wanted: number;
  readonly timeoutMs: number;
  constructor(acked: number, wanted: number, timeoutMs: number) {
    super(
      "not_replicated",
      `the schedule was confirmed by ${acked} of ${wanted} replicas within ${timeoutMs} ms (or the connection broke before they answered); it may have reached the leader and may still fire, and repeating it is safe`,
    );
    this.acked = acked;
    this.wanted = wanted;
    this.timeoutMs = timeoutMs;
  }
  override get writeOutcome(): WriteOutcome {
    return "unknown";
  }
}

/** Redis failed, refused a command, or could not be reached. */
export class RedisError extends DelayqError {
  private readonly outcome: WriteOutcome;
  /** The error code Redis answered with (`OOM`, `NOSCRIPT`, `ERR`, ...), when it answered. */
  readonly redisCode?: string;
  constructor(context: string, cause: unknown) {
    const { outcome, redisCode, text } = classify(cause);
    const code =
      redisCode === "OOM"
        ? "redis_oom"
        : outcome === "unknown"
          ? "outcome_unknown"
          : redisCode === undefined
            ? "redis_unavailable"
            : "internal";
    super(code, `redis error while ${context}: ${text}`, { cause });
    this.outcome = outcome;
    if (redisCode !== undefined) this.redisCode = redisCode;
  }
  override get writeOutcome(): WriteOutcome {
    return this.outcome;
  }
}

/** Redis answered something this client did not expect (a script of another version). */
export class ReplyError extends DelayqError {
  constructor(context: string, detail: string) {
    super("internal", `unexpected reply from redis while ${context}: ${detail}`);
  }
}

/** What happened to one order of a batch that failed part way. */
export type ItemOutcome = "created" | "updated" | "unchanged" | "duplicate" | "cancelled_by_event" | "not_written" | "unknown";

/**
 * A batch failed part way: some of its script calls were applied, others were not or may
 * have been. `results` says, for every order in batch order, which; repeating the batch is
 * safe (scheduling by id is idempotent).
 */
export class PartialBatchError extends DelayqError {
  readonly results: { id: string; outcome: ItemOutcome }[];
  constructor(results: { id: string; outcome: ItemOutcome }[], cause: DelayqError) {
    const written = results.filter(
      (r) => r.outcome === "created" || r.outcome === "updated" || r.outcome === "unchanged",
    ).length;
    super(
      "partial_write",
      `the batch was partly written (${written} of ${results.length} orders written); repeating it is safe: ${cause.message}`,
      { cause },
    );
    this.results = results;
  }
  override get writeOutcome(): WriteOutcome {
    return "unknown";
  }
}

/** The messages of connection-level failures after which a sent command may have run. */
const MAYBE_SENT = [/timed out/i, /connection is closed/i, /ECONNRESET/, /EPIPE/, /socket/i];

function classify(e: unknown): { outcome: WriteOutcome; redisCode?: string; text: string } {
  const err = e as { name?: string; message?: string; code?: string };
  const message = String(err?.message ?? e);
  // A reply from the server: nothing was written by a refused call (scripts check their
  // arguments before writing, and OOM hits at the first write).
  if (err?.name === "ReplyError") {
    const redisCode = message.split(" ", 1)[0] ?? "ERR";
    return { outcome: "not_applied", redisCode, text: message };
  }
  if (err?.name === "MaxRetriesPerRequestError" || /enableOfflineQueue/.test(message)) {
    return { outcome: "not_applied", text: message };
  }
  if (err?.code === "ECONNREFUSED" || /ECONNREFUSED/.test(message)) {
    return { outcome: "not_applied", text: message };
  }
  if (MAYBE_SENT.some((r) => r.test(message))) return { outcome: "unknown", text: message };
  return { outcome: "unknown", text: message };
}
