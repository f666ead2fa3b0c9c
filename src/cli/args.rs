//! The command line's arguments (clap): the global flags and one variant per verb.

use crate::engine::priority::Priority;
use clap::{ArgGroup, Parser, Subcommand};

/// delayq: an order-expiry delay queue on Redis.
#[derive(Debug, Parser)]
#[command(name = "delayq", version, about)]
pub struct Cli {
    /// Redis URL: redis://, rediss:// for TLS, redis+cluster://h1:p1,h2:p2,
    /// redis+sentinel://s1:26379,s2:26379/<master-name>; user:password@ for auth.
    #[arg(
        long,
        global = true,
        env = "DELAYQ_REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// PEM file of the CA that signed the Redis server's certificate, trusted instead of the
    /// system's roots (rediss:// URLs only).
    #[arg(long, global = true, env = "DELAYQ_REDIS_TLS_CA", value_name = "FILE")]
    pub redis_tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate for a Redis that requires one (mutual TLS); needs
    /// --redis-tls-key.
    #[arg(
        long,
        global = true,
        env = "DELAYQ_REDIS_TLS_CERT",
        value_name = "FILE"
    )]
    pub redis_tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, global = true, env = "DELAYQ_REDIS_TLS_KEY", value_name = "FILE")]
    pub redis_tls_key: Option<std::path::PathBuf>,
    /// Key namespace.
    #[arg(long, global = true, env = "DELAYQ_NAMESPACE", default_value = "dq")]
    pub namespace: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Schedule an order.
    Schedule {
        /// Queue name.
        queue: String,
        /// Order id.
        id: String,
        /// Delay from now: 500ms, 30s, 15m, 1h30m.
        #[arg(
            long = "in",
            conflicts_with = "at",
            required_unless_present_any = ["at", "debounce"],
            allow_hyphen_values = true
        )]
        delay: Option<String>,
        /// Absolute time: RFC 3339 with an offset, or unix milliseconds; with --tz, a local
        /// wall-clock time without offset (2027-03-28T09:00).
        #[arg(long, allow_hyphen_values = true)]
        at: Option<String>,
        /// IANA time zone of a local --at (Europe/Berlin): a nonexistent local time moves
        /// to the end of the gap, an ambiguous one takes its first occurrence.
        #[arg(long, requires = "at")]
        tz: Option<String>,
        /// Payload as JSON (default null).
        #[arg(long, default_value = "null")]
        payload: String,
        /// Leave an already scheduled id untouched.
        #[arg(long)]
        if_absent: bool,
        /// Schedule it even if it was dispatched within the queue's dedup window.
        #[arg(long)]
        repeat: bool,
        /// Debounce: due this long after each call (payload replaced), never later than
        /// --max-wait after the first call; instead of --in/--at.
        #[arg(long, requires = "max_wait", conflicts_with_all = ["delay", "at", "if_absent"])]
        debounce: Option<String>,
        /// The debounce's cap from its first call (at least --debounce).
        #[arg(long, requires = "debounce")]
        max_wait: Option<String>,
        /// Priority level: high, normal (the default) or low.
        #[arg(long, value_parser = parse_priority, allow_hyphen_values = true)]
        priority: Option<Priority>,
        /// Not handed to a consumer group later than this past its due time (30m, 1h;
        /// default: the queue's): that group dead-letters it with reason expired instead.
        #[arg(long, allow_hyphen_values = true)]
        expires_after: Option<String>,
        /// A tag (customer:42, order:1234); repeat for more (at most 10): cancel, list or
        /// reschedule every order with a tag at once.
        #[arg(long = "tag", value_name = "TAG", allow_hyphen_values = true)]
        tags: Vec<String>,
        /// The order's key (e.g. merchant:17; 1-128 bytes, no control characters): due
        /// orders are dispatched round robin between keys. An upsert without one removes it.
        #[arg(long, allow_hyphen_values = true)]
        key: Option<String>,
        /// The order's own cancel-on-event rule, EVENT:FIELD[,FIELD...][@REMEMBER] (as
        /// `queue create --cancel-on`); repeatable: an event it names whose data matches
        /// the payload on those fields cancels the order.
        #[arg(long = "cancel-on", value_name = "RULE")]
        cancel_on: Vec<String>,
    },
    /// Post an event (e.g. order.paid): cancels the scheduled orders of every queue whose
    /// cancel_on rules name it and match its data, and is remembered for the rules'
    /// windows; answers how many orders it cancelled.
    Event {
        /// The event name.
        name: String,
        /// Its data, a JSON object (the rules' match fields are read here).
        #[arg(long, default_value = "{}")]
        data: String,
        /// Its id: a repeated post with the same id does nothing (answers duplicate).
        #[arg(long)]
        id: Option<String>,
    },
    /// Show a scheduled order (exit 1 when not scheduled).
    Get {
        /// Queue name.
        queue: String,
        /// Order id.
        id: String,
    },
    /// Cancel a scheduled order (exit 1 when not found), or with --tag every scheduled order
    /// that carries the tag, in --queue or in every queue (answers how many).
    Cancel {
        /// Queue name.
        #[arg(required_unless_present = "tag")]
        queue: Option<String>,
        /// Order id.
        #[arg(required_unless_present = "tag", conflicts_with = "tag")]
        id: Option<String>,
        /// Cancel every scheduled order with this tag instead of one order.
        #[arg(long, allow_hyphen_values = true)]
        tag: Option<String>,
        /// With --tag: only this queue (default: every queue of the namespace).
        #[arg(long = "queue", requires = "tag", conflicts_with = "queue")]
        tag_queue: Option<String>,
    },
    /// List the scheduled orders that carry a tag, one JSON line each (queue, id,
    /// due_at_ms), then a line with the cursor of the next page when there is one.
    List {
        /// The tag.
        #[arg(long, allow_hyphen_values = true)]
        tag: String,
        /// Only this queue (default: every queue of the namespace).
        #[arg(long)]
        queue: Option<String>,
        /// Orders per page (1..=1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// The cursor a previous page printed.
        #[arg(long)]
        after: Option<String>,
    },
    /// Move every scheduled order that carries a tag: to a new due time (--in, --at) or by
    /// a shift (--shift 1h, --shift -10m); answers how many.
    Reschedule {
        /// The tag.
        #[arg(long, allow_hyphen_values = true)]
        tag: String,
        /// Only this queue (default: every queue of the namespace).
        #[arg(long)]
        queue: Option<String>,
        /// Due this long from now (30s, 15m, 1h).
        #[arg(long = "in", conflicts_with_all = ["at", "shift"], required_unless_present_any = ["at", "shift"])]
        delay: Option<String>,
        /// Due at this time: RFC 3339 with an offset, or unix milliseconds.
        #[arg(long, allow_hyphen_values = true, conflicts_with = "shift")]
        at: Option<String>,
        /// Move each order's due time by this much (1h later, -10m earlier).
        #[arg(long, allow_hyphen_values = true)]
        shift: Option<String>,
    },
    /// Run the service: dispatchers, housekeeping, handlers and the HTTP API, as configured.
    /// Redis URL and namespace come from the file (or DELAYQ_REDIS_URL / DELAYQ_NAMESPACE).
    Serve {
        /// The TOML configuration file.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// The whole flow with zero configuration: a simulated checkout service, a dispatcher and
    /// two handler groups; uses --redis-url when it answers, else a throwaway redis-server
    /// (feature dev-tools: `cargo run`, not the container image).
    Demo {
        /// Orders to create.
        #[arg(long, default_value_t = 2000)]
        orders: usize,
        /// Orders expire uniformly within this window (after a 1 s lead).
        #[arg(long, default_value = "10s")]
        window: String,
        /// Share of customers who pay in time, percent.
        #[arg(long, default_value_t = 30)]
        paid_percent: u32,
        /// The orders database (postgres://... or sqlite://file); default: a temporary
        /// SQLite file.
        #[arg(long, env = "DELAYQ_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
    /// Apply the orders schema (the embedded migrations) to a database. Idempotent; creates a
    /// missing SQLite file; refuses a database whose applied migrations were modified.
    Migrate {
        /// postgres://user@host/db or sqlite://file.
        #[arg(long, env = "DELAYQ_DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Queue statistics: scheduled, overdue, stream, per-group pending / lag / consumers, dead.
    Stats {
        /// One queue (default: every queue of the namespace).
        queue: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Redraw every second until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Queues: create (the first step of a deployment), list, delete.
    Queue {
        /// What to do.
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Consumer groups: delete one whose handler is gone (so stream trimming resumes); list
    /// the order keys in use.
    Group {
        /// What to do.
        #[command(subcommand)]
        action: GroupAction,
    },
    /// Recurring schedules (cron expressions or intervals): add, list, show, remove. Each
    /// tick is an ordinary order `<ID>@<instant ms>`; the schedulers of `serve` advance them.
    Cron {
        /// What to do.
        #[command(subcommand)]
        action: CronAction,
    },
    /// Dead letters: list, replay to the group that failed them, purge.
    Dead {
        /// What to do.
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Measure delayq on this Redis (own namespace, cleaned up; starts a throwaway
    /// redis-server when none is reachable). Feature `dev-tools` (on by default; not in the
    /// container image).
    #[cfg(feature = "dev-tools")]
    Bench {
        /// Scenarios, comma separated: spread, storm, storm3, enqueue, ceiling, dispatch, depth, idle
        /// (idle: `--queues` queues of `--shards` shards, nothing due, `--processes` serve
        /// processes, for `--window`), schedules (`--orders` recurring schedules ticking every
        /// minute, for `--window`), scripts (each hot-path script's Redis time per call at 1,
        /// 10, 100 and 1,000 orders), seed and seed-storm (the seed posts' design: Lua
        /// enqueue, a poller into a stream, a consumer group; with spread or storm in the same
        /// run, a line with the ratio of Redis CPU per order), cross (orders scheduled by
        /// another process by raw EVALSHA, due 10-200 ms ahead: lateness).
        #[arg(long, default_value = "spread")]
        scenario: String,
        /// Orders per scenario.
        #[arg(long, default_value_t = 100_000)]
        orders: usize,
        /// Time from the start to the first due order.
        #[arg(long, default_value = "3s")]
        lead: String,
        /// Spread of the due times (spread).
        #[arg(long, default_value = "10s")]
        window: String,
        /// Worker concurrency.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
        /// Payload size, bytes.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Shards per queue (default 1; idle: 4).
        #[arg(long)]
        shards: Option<u16>,
        /// idle: queues declared (default 100).
        #[arg(long, default_value_t = 100)]
        queues: usize,
        /// idle: `delayq serve` processes started (0: the supervisor and maintenance run in
        /// the bench process); spread, storm: dispatchers, each on a client of its own
        /// (splitting the shards through the dispatch roster).
        #[arg(long, default_value_t = 1)]
        processes: usize,
        /// A rate limit for the bench's handler group (e.g. 1000000/s), to measure its cost.
        #[arg(long)]
        rate_limit: Option<String>,
        /// The bench queue's order-history retention (default 24h, as every queue; 0s: off).
        #[arg(long, default_value = "24h")]
        history_retention: String,
        /// The dispatcher's linger between small passes (default: the library's, off).
        #[arg(long)]
        linger: Option<String>,
        /// The dispatcher's lateness budget (default: the library's, 5ms; 0s: dispatch each
        /// order as soon as it is due).
        #[arg(long)]
        lateness_budget: Option<String>,
        /// The dispatchers' takeover_after (e.g. 0s: every process calls every shard).
        #[arg(long)]
        takeover_after: Option<String>,
        /// Every order carries a W3C trace context (stored and decoded; nothing exported).
        #[arg(long)]
        traced: bool,
        /// Tags per order (0..=10; spread and storm): each order carries this many tags
        /// (`t<k>:<i mod 100>`), kept in the shard's tag index.
        #[arg(long, default_value_t = 0)]
        tags: usize,
        /// Order keys (spread, storm, enqueue): order i gets key `k<i mod N>` (0: none, the
        /// default), so the dispatcher shares the backlog between N keys.
        #[arg(long, default_value_t = 0)]
        keys: usize,
        /// Print one JSON line per scenario (the last line of stdout).
        #[arg(long)]
        json: bool,
    },
    /// Ask the local `delayq serve` for /healthz (or /readyz with --ready): exit 0 on 200,
    /// else 1, with one line. The address is serve's http.listen, read from the same file
    /// and DELAYQ_* environment (DELAYQ_HTTP__LISTEN); 0.0.0.0 is asked on 127.0.0.1.
    Healthcheck {
        /// serve's TOML configuration file (default: serve's defaults and the environment).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// Ask /readyz (serve reaches Redis) instead of /healthz (the process answers).
        #[arg(long)]
        ready: bool,
        /// Longest wait for the answer.
        #[arg(long, default_value = "3s")]
        timeout: String,
    },
    /// The Lua scripts the engine runs, for producers in other languages.
    Scripts {
        /// What to do with them.
        #[command(subcommand)]
        action: ScriptsAction,
    },
}

/// The `scripts` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum ScriptsAction {
    /// Write every script, exactly as the engine runs it, to DIR/<name>.lua; print one
    /// {"script","sha1","bytes"} line each (the SHA1 is what EVALSHA takes).
    Export {
        /// The directory (created if missing).
        dir: std::path::PathBuf,
    },
}

/// The `queue` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Register a queue (idempotent; exit 2 if it exists with another shard count).
    Create {
        /// Queue name.
        queue: String,
        /// Shards (fixed for the queue's life).
        #[arg(long, default_value_t = 1)]
        shards: u16,
        /// How long the history of dispatched orders is kept (default 24h; 0s: none).
        #[arg(long)]
        history_retention: Option<String>,
        /// The default expires_after of orders that set none (e.g. 30m; 0s clears it): an
        /// order a group would get later than this past its due time is dead-lettered for
        /// that group with reason expired.
        #[arg(long, allow_hyphen_values = true)]
        expires_after: Option<String>,
        /// Dedup window after dispatch (e.g. 24h; 0s: off, the default): scheduling an id
        /// dispatched within it answers duplicate unless --repeat.
        #[arg(long)]
        dedup_window: Option<String>,
        /// A cancel-on-event rule, EVENT:FIELD[,FIELD...][@REMEMBER] (e.g.
        /// order.paid:order_id, remembered 15m by default); repeatable. Orders whose payload
        /// field equals an event's data field are cancelled by the event.
        #[arg(long = "cancel-on")]
        cancel_on: Vec<String>,
    },
    /// List the registered queues, one JSON line each.
    List,
    /// Pause dispatch of a queue, or one group's consumption (--group); orders wait, none
    /// is lost.
    Pause {
        /// Queue name.
        queue: String,
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Resume what `pause` stopped.
    Resume {
        /// Queue name.
        queue: String,
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Delete a queue and all it holds (refused while anything is scheduled, pending or
    /// dead, unless --force; exit 1 if unknown).
    Delete {
        /// Queue name.
        queue: String,
        /// Delete even when it holds work.
        #[arg(long)]
        force: bool,
    },
}

/// The `group` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum GroupAction {
    /// Delete a consumer group on every shard, with its timers (refused, exit 2, while a
    /// consumer of it read within the last minute, unless --force; exit 1 if unknown).
    Delete {
        /// Queue name.
        queue: String,
        /// Group name.
        group: String,
        /// Delete even while a consumer reads it.
        #[arg(long)]
        force: bool,
    },
    /// The group's order keys in use (key_concurrency, key_sequence), busiest first: slots
    /// held and entries waiting per key, as JSON (`next` is the next page's --after).
    Keys {
        /// Queue name.
        queue: String,
        /// Group name.
        group: String,
        /// Keys per page, 1..=1000 (default 100).
        #[arg(long)]
        limit: Option<usize>,
        /// The previous page's `next`.
        #[arg(long)]
        after: Option<String>,
    },
}

/// The `dead` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum DeadAction {
    /// List dead letters, oldest first.
    List {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this dead-letter entry id (the cursor printed after a full page).
        #[arg(long)]
        after: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Redeliver dead letters to the group that failed them (attempts start again at 1).
    Replay {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// Every dead letter (of the group, if given).
        #[arg(long, conflicts_with = "entry_ids")]
        all: bool,
        /// Dead-letter entry ids (as listed).
        entry_ids: Vec<String>,
    },
    /// Delete dead letters for good.
    Purge {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// Every dead letter (of the group, if given).
        #[arg(long, conflicts_with = "entry_ids")]
        all: bool,
        /// Dead-letter entry ids (as listed).
        entry_ids: Vec<String>,
    },
}

/// The `cron` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum CronAction {
    /// Declare or replace a recurring schedule (the queue must be registered); its next
    /// tick is scheduled at once.
    #[command(group(ArgGroup::new("recurrence").required(true).args(["cron", "every"])))]
    Add {
        /// Queue name (registered: `delayq queue create`).
        queue: String,
        /// Schedule id: A-Z a-z 0-9 . _ - (1..=128 bytes).
        id: String,
        /// A cron expression: 6 fields `sec min hour day-of-month month day-of-week`
        /// (e.g. "0 30 2 * * *") or the classic 5 fields.
        #[arg(long, allow_hyphen_values = true)]
        cron: Option<String>,
        /// An interval (30s, 5m, 1h30m; at least 1s), ticks aligned to the Unix epoch (or to
        /// --start).
        #[arg(long, allow_hyphen_values = true)]
        every: Option<String>,
        /// IANA time zone for the cron fields (default UTC), e.g. Europe/Berlin.
        #[arg(long)]
        timezone: Option<String>,
        /// Payload every tick delivers, as JSON.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// No tick before this: RFC 3339 with an offset, or unix milliseconds.
        #[arg(long, allow_hyphen_values = true)]
        start: Option<String>,
        /// No tick after this: RFC 3339 with an offset, or unix milliseconds.
        #[arg(long, allow_hyphen_values = true)]
        end: Option<String>,
        /// Ticks that passed while no scheduler ran: skip them (default) or deliver one
        /// catch-up tick.
        #[arg(long, value_parser = ["skip", "fire_once"])]
        missed: Option<String>,
        /// Print the answer as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// List recurring schedules, sorted by queue and id.
    List {
        /// One queue (default: every queue of the namespace).
        queue: Option<String>,
        /// Print one JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a schedule with its next fire times (exit 1 when there is none).
    Show {
        /// Queue name.
        queue: String,
        /// Schedule id.
        id: String,
        /// Print one JSON line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule and take its pending tick back (exit 1 when there is none).
    Remove {
        /// Queue name.
        queue: String,
        /// Schedule id.
        id: String,
    },
    /// Pause a schedule: its pending tick is taken back and nothing ticks until resumed.
    Pause {
        /// Queue name.
        queue: String,
        /// Schedule id.
        id: String,
    },
    /// Resume a paused schedule from the next instant after now.
    Resume {
        /// Queue name.
        queue: String,
        /// Schedule id.
        id: String,
    },
}

/// `--priority`: the engine's one rule ([`Priority::parse`]); clap names the flag and exits 2
/// (a value that looks like a flag, `-1`, is given to it too).
fn parse_priority(text: &str) -> Result<Priority, String> {
    Priority::parse(text).map_err(|e| e.to_string())
}
