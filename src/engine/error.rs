//! The engine's errors: one enum for the engine, one for rejected input. The layers above
//! have their own and wrap this one (`orders::Error`, `ConfigError`).
//!
//! Input errors ([`InvalidInput`]) are raised before anything is sent to Redis, so a
//! rejected call never changes anything. Each variant names the field that is wrong and
//! has a stable machine-readable [`code`](InvalidInput::code) for APIs.

use crate::engine::outcome::WriteOutcome;

/// The result type of the engine (and of the crate's API built on it).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something invalid; nothing was written.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// Redis failed or could not be reached while doing `context`.
    #[error("redis error while {context}: {source}")]
    Redis {
        /// What delayq was doing.
        context: &'static str,
        /// The error from the redis crate.
        #[source]
        source: redis::RedisError,
    },
    /// Redis answered something delayq did not expect (a key of the wrong type, a script
    /// from another version).
    #[error("unexpected reply from redis while {context}: {detail}")]
    Reply {
        /// What delayq was doing.
        context: &'static str,
        /// What was unexpected.
        detail: String,
    },
    /// A local resource could not be set up or used: binding a listener, building an HTTP
    /// client (TLS), serving connections.
    #[error("{context}: {source}")]
    Io {
        /// What delayq was doing.
        context: String,
        /// The operating system's (or the library's) error.
        #[source]
        source: std::io::Error,
    },
    /// The cron scheduler that runs housekeeping and reconciliation failed.
    #[error("cron scheduler error while {context}: {detail}")]
    Scheduler {
        /// What delayq was doing.
        context: &'static str,
        /// The scheduler's message.
        detail: String,
    },
    /// The queue is not registered (create it first: `Queues::create_queue`, `delayq queue
    /// create`, `PUT /v1/queues/{q}`, or a `delayq serve` that dispatches it). Nothing was
    /// written.
    #[error("queue {queue:?} does not exist (create it first: delayq queue create {queue})")]
    QueueNotFound {
        /// The queue.
        queue: String,
    },
    /// The queue is registered with another shard count; the count is fixed at creation.
    #[error(
        "queue {queue:?} was created with {existing} shards, not {wanted} (the shard count of a queue is fixed at creation)"
    )]
    ShardMismatch {
        /// The queue.
        queue: String,
        /// Its registered count.
        existing: u16,
        /// The count asked for.
        wanted: u16,
    },
    /// No shard of the queue has this consumer group.
    #[error("queue {queue:?} has no consumer group {group:?}")]
    GroupNotFound {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// A delete without `force` of a group that a live consumer still reads.
    #[error(
        "consumer group {group:?} of queue {queue:?} has a consumer that read within the last {alive_ms} ms (stop its workers, or use force)"
    )]
    GroupBusy {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// The window in which a read counts as alive.
        alive_ms: u64,
    },
    /// A delete without `force` of a queue that still holds work.
    #[error(
        "queue {queue:?} is not empty: {scheduled} scheduled, {unread} not yet read by a group{}, {pending} pending, {dead} dead (use force to delete it anyway)",
        lag_text(lag)
    )]
    QueueNotEmpty {
        /// The queue.
        queue: String,
        /// Orders scheduled.
        scheduled: u64,
        /// Stream entries some group has not read yet (the largest lag of any group).
        unread: u64,
        /// Each group's lag: entries it has not read yet.
        lag: Vec<(String, u64)>,
        /// Entries pending in some group.
        pending: u64,
        /// Dead letters.
        dead: u64,
    },
    /// The namespace already has the most queues it may have (`max_queues`).
    #[error(
        "the namespace already has {max} queues, the most it may have (delete one, or raise max_queues)"
    )]
    TooManyQueues {
        /// The cap.
        max: usize,
    },
    /// The queue already has the most consumer groups it may have (`max_groups`).
    #[error(
        "queue {queue:?} already has {max} consumer groups, the most it may have (delete one, or raise max_groups)"
    )]
    TooManyGroups {
        /// The queue.
        queue: String,
        /// The cap.
        max: usize,
    },
    /// The Redis server is older than delayq needs.
    #[error("{found} is not supported: delayq needs redis {required} or newer (or any valkey)")]
    UnsupportedServer {
        /// The version the server reported (`INFO server`).
        found: String,
        /// The oldest version delayq runs on.
        required: String,
    },
    /// The namespace already has the most recurring schedules it may have.
    #[error(
        "the namespace already has {max} recurring schedules, the most it may have (remove one)"
    )]
    TooManySchedules {
        /// The cap.
        max: usize,
    },
    /// The consumer group was deleted while its worker ran: the worker stops rather than
    /// create it again (which would deliver every retained entry once more).
    #[error("consumer group {group:?} of queue {queue:?} was deleted; its worker stopped")]
    GroupDeleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// A durable write (a schedule, a reschedule or a cancel) was not confirmed by enough
    /// replicas in time, or its connection broke before they answered. It may have been
    /// applied on the leader (a schedule may still fire); retrying it is safe
    /// (idempotent).
    #[error(
        "the schedule was confirmed by {acked} of {wanted} replicas within {timeout:?} (or the connection broke before they answered); it may have reached the leader and may still fire, and repeating it is safe"
    )]
    NotReplicated {
        /// Replicas that confirmed.
        acked: u32,
        /// Replicas required.
        wanted: u32,
        /// How long was waited.
        timeout: std::time::Duration,
    },
    /// A batch failed part way: some of its script calls were applied, others were not or
    /// may have been. `results` says, for every order in batch order, which; repeating the
    /// batch is safe (scheduling by id is idempotent).
    #[error(
        "the batch was partly written ({} of {} orders written); repeating it is safe: {source}",
        results.iter().filter(|r| matches!(r.outcome, crate::engine::outcome::ItemOutcome::Created | crate::engine::outcome::ItemOutcome::Updated | crate::engine::outcome::ItemOutcome::Unchanged)).count(),
        results.len()
    )]
    PartialBatch {
        /// One result per order, in batch order.
        results: Vec<crate::engine::outcome::BatchItem>,
        /// Why the rest failed.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// True when retrying the same call later may succeed (connection refused, reset or
    /// timed out, server loading, cluster redirections, a failover in progress).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis { source, .. } => is_transient_redis(source),
            _ => false,
        }
    }

    /// A copy of this error, for reporting one failure on several calls (e.g. every call
    /// of a batch that needed a connection that could not be opened). Variants that hold a
    /// source which cannot be copied keep its message.
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Invalid(i) => Error::Invalid(i.clone()),
            Error::Redis { context, source } => Error::Redis {
                context,
                source: source.clone(),
            },
            Error::Reply { context, detail } => Error::Reply {
                context,
                detail: detail.clone(),
            },
            Error::NotReplicated {
                acked,
                wanted,
                timeout,
            } => Error::NotReplicated {
                acked: *acked,
                wanted: *wanted,
                timeout: *timeout,
            },
            Error::QueueNotFound { queue } => Error::QueueNotFound {
                queue: queue.clone(),
            },
            other => Error::Io {
                context: other.to_string(),
                source: std::io::Error::other("(copied error)"),
            },
        }
    }

    /// For a failed write: whether it may have been applied. A call Redis refused (out of
    /// memory, a script's argument check, a read-only replica, a refused connection) wrote
    /// nothing; one that timed out or lost its connection after it was sent may have.
    pub fn write_outcome(&self) -> WriteOutcome {
        match self {
            Error::Redis { source, .. }
                if !source.is_connection_refusal()
                    && (source.is_timeout()
                        || source.is_connection_dropped()
                        || source.is_io_error()) =>
            {
                WriteOutcome::Unknown
            }
            Error::NotReplicated { .. } | Error::PartialBatch { .. } => WriteOutcome::Unknown,
            _ => WriteOutcome::NotApplied,
        }
    }

    /// True when Redis refused a write for lack of memory (`maxmemory` reached).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Redis { source, .. } => source.code() == Some("OOM"),
            Error::PartialBatch { source, .. } => source.is_out_of_memory(),
            _ => false,
        }
    }

    /// The input error, when this is one.
    pub fn as_invalid(&self) -> Option<&InvalidInput> {
        match self {
            Error::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

/// `" (lag: a=3, b=50)"`, or nothing when no group lags.
fn lag_text(lag: &[(String, u64)]) -> String {
    let lagging: Vec<String> = lag
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(g, n)| format!("{g}={n}"))
        .collect();
    if lagging.is_empty() {
        String::new()
    } else {
        format!(" (lag: {})", lagging.join(", "))
    }
}

/// Whether a redis error is worth retrying (the connection or the server's role may recover).
pub(crate) fn is_transient_redis(e: &redis::RedisError) -> bool {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        return true;
    }
    matches!(
        e.code(),
        Some(
            "LOADING"
                | "BUSY"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "MASTERDOWN"
                | "UNBLOCKED"
                | "READONLY"
                // The master refuses writes while fewer replicas than `min-replicas-to-write`
                // follow it (during a failover): nothing was done, a retry may succeed.
                | "NOREPLICAS"
        )
    )
}

/// Attaches "what delayq was doing" to a redis error.
pub(crate) trait RedisContext<T> {
    /// Wraps the error as [`Error::Redis`] with `context`.
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> RedisContext<T> for redis::RedisResult<T> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| Error::Redis { context, source })
    }
}

/// Input that delayq refuses. Nothing is written to Redis when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A queue name outside `[A-Za-z0-9._-]{1,64}`.
    #[error("invalid queue name {name:?}: {reason}")]
    QueueName {
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// A key namespace outside `[A-Za-z0-9._-]{1,64}`.
    #[error("invalid namespace {name:?}: {reason}")]
    Namespace {
        /// The namespace as given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// An order id that is empty, longer than 256 bytes or holds a control character.
    #[error("invalid id: {reason}")]
    Id {
        /// Why it was refused.
        reason: String,
    },
    /// A consumer group or consumer name that is empty, too long or holds a control character.
    #[error("invalid {field}: {reason}")]
    Name {
        /// Which name ("group", "consumer").
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A payload that is not one valid JSON value.
    #[error("invalid payload: {reason}")]
    Payload {
        /// The JSON parser's message.
        reason: String,
    },
    /// A payload larger than the configured limit.
    #[error("payload too large: {size} bytes, the limit is {limit} bytes")]
    PayloadTooLarge {
        /// The payload's size in bytes (as JSON text).
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A negative or absurdly long delay.
    #[error("invalid delay: {reason}")]
    Delay {
        /// Why it was refused.
        reason: String,
    },
    /// An absolute due time that does not parse, is before 1970 or too far ahead.
    #[error("invalid due time: {reason}")]
    DueTime {
        /// Why it was refused.
        reason: String,
    },
    /// An unknown IANA time zone for a local wall-clock due time (`timezone`), or one
    /// missing where `at_local` needs it or given without it.
    #[error("invalid timezone: {reason}")]
    TimeZone {
        /// Why it was refused.
        reason: String,
    },
    /// A local wall-clock due time (`at_local`) that is malformed, carries a UTC offset, or
    /// is given together with another due-time field.
    #[error("invalid at_local: {reason}")]
    LocalTime {
        /// Why it was refused.
        reason: String,
    },
    /// A Redis URL that does not parse.
    #[error("invalid redis url: {reason}")]
    RedisUrl {
        /// Why it was refused.
        reason: String,
    },
    /// An option with a value out of range.
    #[error("invalid option {name}: {reason}")]
    Option {
        /// The option's name.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A priority level other than `high`, `normal` or `low`, or bad priority weights.
    #[error("invalid priority: {reason}")]
    Priority {
        /// Why it was refused.
        reason: String,
    },
    /// A dead-letter replay or purge that names neither every dead letter nor a list of
    /// entry ids (or both).
    #[error("invalid selection: {reason}")]
    Selection {
        /// Why it was refused.
        reason: String,
    },
    /// A pull receipt that this puller did not issue (malformed, altered, forged, or of
    /// another group or puller).
    #[error("invalid receipt: {reason}")]
    Receipt {
        /// Why it was refused.
        reason: &'static str,
    },
    /// A batch with more messages than one call accepts.
    #[error("{size} messages; at most {limit} per call")]
    BatchTooLarge {
        /// Messages given.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// One message of a batch is invalid; the whole batch was refused.
    #[error("message {index}: {source}")]
    InBatch {
        /// The message's index in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: Box<InvalidInput>,
    },
}

impl InvalidInput {
    /// A stable snake_case code for APIs, e.g. `invalid_id`, `payload_too_large`.
    pub fn code(&self) -> &'static str {
        match self {
            InvalidInput::QueueName { .. } => "invalid_queue",
            InvalidInput::Namespace { .. } => "invalid_namespace",
            InvalidInput::Id { .. } => "invalid_id",
            InvalidInput::Name { .. } => "invalid_name",
            InvalidInput::Payload { .. } => "invalid_payload",
            InvalidInput::PayloadTooLarge { .. } => "payload_too_large",
            InvalidInput::Delay { .. } => "invalid_delay",
            InvalidInput::DueTime { .. } => "invalid_due_time",
            InvalidInput::TimeZone { .. } => "invalid_timezone",
            InvalidInput::LocalTime { .. } => "invalid_local_time",
            InvalidInput::RedisUrl { .. } => "invalid_redis_url",
            InvalidInput::Option { .. } => "invalid_option",
            InvalidInput::Selection { .. } => "invalid_body",
            InvalidInput::Priority { .. } => "invalid_priority",
            InvalidInput::Receipt { .. } => "invalid_receipt",
            InvalidInput::BatchTooLarge { .. } => "batch_too_large",
            InvalidInput::InBatch { source, .. } => source.code(),
        }
    }
}
