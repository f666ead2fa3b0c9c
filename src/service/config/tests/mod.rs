use super::*;
use crate::engine::priority::PriorityMode;

/// [`super::load_str`] with a Redis URL when the text names none (it is required).
fn load_str(text: &str, env: Env) -> Result<Settings, ConfigError> {
    if text.contains("redis_url") {
        super::load_str(text, env)
    } else {
        super::load_str(
            &format!("redis_url = \"redis://127.0.0.1:6379\"\n{text}"),
            env,
        )
    }
}

#[test]
fn redis_url_is_required() {
    let e = super::load_str("", env()).unwrap_err();
    assert_eq!(e.key.as_deref(), Some("redis_url"), "{e}");
}

fn env() -> Env {
    Env::prefixed("DELAYQ_TEST_NONE_")
}

const GOOD: &str = r#"
redis_url = "redis://127.0.0.1:6379"
namespace = "dq"
[http]
listen = "127.0.0.1:7070"
tokens = ["change-me"]
max_body_bytes = 1048576
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "webhook"
url = "http://127.0.0.1:9000/orders/close"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
concurrency = 16
timeout = "10s"
max_attempts = 10
backoff = "linear:2m:1m"
visibility_timeout = "30s"
"#;

#[test]
fn the_environment_keys_are_the_config_keys() {
    // The file's keys: `Config`'s, the client's options in place of the field that embeds
    // them.
    let top = ["namespace".to_owned()];
    let mut fields = embed::known(&top, embed::fields_of::<Config>());
    let mut known = raw::TOP_LEVEL_KEYS.to_vec();
    fields.sort_unstable();
    known.sort_unstable();
    assert_eq!(fields, known);
}

#[test]
fn the_documented_example_loads() {
    let s = load_str(GOOD, env()).unwrap();
    assert_eq!(s.handlers.len(), 1);
    assert_eq!(s.queues, vec!["order-close"]);
    assert_eq!(
        s.handlers[0].worker.handler_timeout,
        Duration::from_secs(10)
    );
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (
            GOOD.replace(
                "namespace = \"dq\"",
                "namespace = \"dq\"\nnamespaec = \"x\"",
            ),
            "namespaec",
        ),
        (
            GOOD.replace(
                "max_body_bytes = 1048576",
                "max_body_bytes = 1048576\nport = 1",
            ),
            "port",
        ),
        (
            GOOD.replace("concurrency = 16", "concurrency = 16\nretries = 3"),
            "retries",
        ),
        (
            GOOD.replace("timeout = \"10s\"", "timeout = \"10 seconds\""),
            "handlers[0].timeout",
        ),
        (
            GOOD.replace("linear:2m:1m", "linear:2m"),
            "handlers[0].backoff",
        ),
        (
            GOOD.replace("kind = \"webhook\"", "kind = \"email\""),
            "handlers[0].kind",
        ),
        (GOOD.replace("127.0.0.1:7070", "localhost"), "http.listen"),
        (
            GOOD.replace("concurrency = 16", "concurrency = \"many\""),
            "concurrency",
        ),
        (
            GOOD.replace("redis://127.0.0.1:6379", "mysql://x"),
            "redis_url",
        ),
        (
            GOOD.replace("http://127.0.0.1:9000/orders/close", "ftp://x"),
            "handlers[0].url",
        ),
    ];
    for (text, key) in cases {
        let e = load_str(&text, env()).unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
}

/// The top-level `namespace`, `shards`, `max_payload_bytes`, `durability`, `max_queues`
/// and `max_groups` are the library's `ClientOptions`: unset keys keep its defaults, the
/// values reach it as they are, and its limits are refused under the key.
#[test]
fn the_client_keys_are_the_library_type() {
    use crate::engine::client::{ClientOptions, Durability};
    assert_eq!(
        load_str("", env()).unwrap().client,
        ClientOptions::default()
    );
    let s = load_str(
        "namespace = \"shop\"\nshards = 4\nmax_payload_bytes = 1000\ndurability = \"replicated\"\n\
         max_queues = 10\nmax_groups = 5\n",
        env(),
    )
    .unwrap();
    let want = ClientOptions::default()
        .namespace("shop")
        .shards(4)
        .max_payload_bytes(1000)
        .durability(Durability::replicated())
        .max_queues(10)
        .max_groups(5);
    assert_eq!(s.client, want);
    for (text, key) in [
        ("shards = 0\n", "shards"),
        ("shards = 1025\n", "shards"),
        ("shards = 70000\n", "shards"),
        ("max_payload_bytes = 0\n", "max_payload_bytes"),
        ("namespace = \"a b\"\n", "namespace"),
        ("durability = \"always\"\n", "durability"),
        ("durability = 1\n", "durability"),
        ("max_queues = 0\n", "max_queues"),
        ("max_groups = 10001\n", "max_groups"),
        ("response_timeout = \"1s\"\n", "response_timeout"),
        ("\"<options>\" = {}\n", "<options>"),
    ] {
        let e = load_str(text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
    }
}

/// `[http]`'s limits are the edge's `HttpLimits`, beside `listen`, `tokens` and
/// `consumer_tokens`: the values reach it as they are (the listen address allowed besides
/// the hosts given), and its limits are refused under the key.
#[test]
fn the_http_limits_are_the_library_type() {
    use crate::service::http::HttpLimits;
    let s = load_str("", env()).unwrap();
    assert_eq!(s.http, HttpLimits::default().allow_listen_host(s.listen));
    let s = load_str(
        "[http]\nlisten = \"127.0.0.1:7071\"\nmax_body_bytes = 2048\nheader_timeout = \"2s\"\n\
         max_connections = 5\nallowed_hosts = [\"shop.example\"]\n\
         trusted_proxies = [\"10.0.0.1\"]\nmetrics_token = \"metrics-123\"\n",
        env(),
    )
    .unwrap();
    let mut want = HttpLimits::default()
        .max_body_bytes(2048)
        .header_timeout(Duration::from_secs(2))
        .max_connections(5);
    want.allowed_hosts = vec!["shop.example".into()];
    want.trusted_proxies = vec!["10.0.0.1".parse().unwrap()];
    want.metrics_token = Some(crate::service::http::limits::MetricsToken(
        "metrics-123".into(),
    ));
    assert_eq!(s.http, want.allow_listen_host(s.listen));
    for (text, key) in [
        ("max_body_bytes = 0", "http.max_body_bytes"),
        ("header_timeout = \"soon\"", "http.header_timeout"),
        ("request_timeout = \"0s\"", "http.request_timeout"),
        ("allowed_hosts = []", "http.allowed_hosts"),
        (
            "trusted_proxies = [\"10.0.0.1\", \"nope\"]",
            "http.trusted_proxies[1]",
        ),
        ("trusted_proxies = [5]", "http.trusted_proxies.0"),
        ("metrics_token = \"short\"", "http.metrics_token"),
        ("\"<options>\" = 1", "http.<options>"),
    ] {
        let e = load_str(&format!("[http]\n{text}\n"), env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
    }
}

/// `[dispatcher]`, `[housekeeping]` and `[dead]` are the library's option types
/// (`DispatcherOptions`, `HousekeepingOptions`, `DeadLetterOptions`), deserialized as they
/// are: unset keys keep the library's defaults, durations are written as everywhere else,
/// the library's ranges are refused under the config's key, and an option the file does
/// not have (`clock_sync_every`, `dead` inside `[housekeeping]`) is an unknown key.
#[test]
fn option_tables_are_the_library_types() {
    use crate::engine::loops::dispatcher::DispatcherOptions;
    use crate::engine::loops::housekeeping::HousekeepingOptions;
    let s = load_str("", env()).unwrap();
    assert_eq!(s.dispatcher, DispatcherOptions::default());
    assert_eq!(s.housekeeping, HousekeepingOptions::default());
    let s = load_str(
        "[dispatcher]\nmax_call = \"2ms\"\nlinger = \"1ms\"\n\
         [housekeeping]\nconsumer_max_idle = \"1h30m\"\nsweep_cron = \"*/5 * * * * *\"\n\
         [dead]\nretention = \"2d\"\nmax_per_queue = 7\n",
        env(),
    )
    .unwrap();
    let want = DispatcherOptions::default()
        .max_call(Duration::from_millis(2))
        .linger(Duration::from_millis(1));
    assert_eq!((&s.dispatcher, &s.config.dispatcher), (&want, &want));
    let want = HousekeepingOptions::default()
        .consumer_max_idle(Duration::from_secs(5400))
        .sweep_cron("*/5 * * * * *")
        .dead_retention(Duration::from_secs(2 * 86_400))
        .dead_max_per_queue(7);
    assert_eq!(s.housekeeping, want);
    for (text, key, words) in [
        (
            "[dispatcher]\nbatch = 1001\n",
            "dispatcher.batch",
            "1..=1000",
        ),
        (
            "[dispatcher]\nbatch = \"many\"\n",
            "dispatcher.batch",
            "found a string",
        ),
        (
            "[dispatcher]\nmax_idle = \"0s\"\n",
            "dispatcher.max_idle",
            "more than zero",
        ),
        (
            "[dispatcher]\nmax_idle = \"soon\"\n",
            "dispatcher.max_idle",
            "is not a duration",
        ),
        (
            "[dispatcher]\nmax_idle = 5\n",
            "dispatcher.max_idle",
            "expected a string",
        ),
        (
            "[dispatcher]\nidle_poll = \"0s\"\n",
            "dispatcher.idle_poll",
            "more than zero",
        ),
        (
            "[dispatcher]\nmax_call = \"2s\"\n",
            "dispatcher.max_call",
            "at most",
        ),
        (
            "[dispatcher]\nlinger = \"51ms\"\n",
            "dispatcher.linger",
            "at most 50ms",
        ),
        (
            "[dispatcher]\nlateness_budget = \"2s\"\n",
            "dispatcher.lateness_budget",
            "at most",
        ),
        (
            "[dispatcher]\nclock_sync_every = \"1s\"\n",
            "dispatcher.clock_sync_every",
            "unknown key",
        ),
        (
            "[housekeeping]\ntrim_cron = \"* * *\"\n",
            "housekeeping.trim_cron",
            "",
        ),
        (
            "[housekeeping]\nconsumer_max_idle = \"1hour\"\n",
            "housekeeping.consumer_max_idle",
            "unknown unit",
        ),
        (
            "[housekeeping]\ndead = 1\n",
            "housekeeping.dead",
            "unknown key \"dead\"",
        ),
        (
            "[dead]\nretention = \"-1s\"\n",
            "dead.retention",
            "negative",
        ),
        (
            "[dead]\nmax_per_queue = 0\n",
            "dead.max_per_queue",
            "at least 1",
        ),
        (
            "[dead]\nretension = \"1d\"\n",
            "dead.retension",
            "unknown key \"retension\"",
        ),
    ] {
        let e = load_str(text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        assert!(e.to_string().contains(words), "{text}: {e}");
    }
}

#[test]
fn secrets_never_show_in_errors_or_debug_output() {
    // A value of the wrong type is named by its key and kind, never echoed.
    for (text, key) in [
        ("[http]\ntokens = \"TOKEN-VALUE-123\"\n", "http.tokens"),
        ("redis_url = [\"redis://:PASSWORD@h:1\"]\n", "redis_url"),
        (
            "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"webhook\"\nurl = \"http://h/x?token=QUERY-SECRET\"\nsecret = 42\n",
            "handlers",
        ),
        (
            "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"webhook\"\nurl = \"ftp://u:URLPASS@h/x?token=QUERY-SECRET\"\n",
            "handlers[0].url",
        ),
    ] {
        let e = load_str(text, env()).unwrap_err().to_string();
        assert!(e.contains(key), "{key}: {e}");
        for secret in ["TOKEN-VALUE-123", "PASSWORD", "QUERY-SECRET", "URLPASS"] {
            assert!(!e.contains(secret), "{e}");
        }
    }
    let text = r#"
redis_url = "redis://:REDISPASS@127.0.0.1:6379"
[http]
tokens = ["HTTP-TOKEN-1234"]
[[handlers]]
queue = "q"
group = "g"
kind = "webhook"
url = "https://u:HOOKPASS@h/x?token=HOOK-QUERY"
secret = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_YS1zZWNvbmQtc2VjcmV0LVNFQ09ORA=="]
[[handlers]]
queue = "q"
group = "c"
kind = "order-close"
database_url = "postgres://app:DBPASS@db/shop"
"#;
    let settings = load_str(text, env()).unwrap();
    let shown = format!("{settings:?}");
    for secret in [
        "REDISPASS",
        "HTTP-TOKEN-1234",
        "HOOKPASS",
        "HOOK-QUERY",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "YS1zZWNvbmQtc2VjcmV0LVNFQ09ORA==",
        "DBPASS",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

#[test]
fn redis_tls_files_are_checked_naming_their_key_and_travel_in_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let pem = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    // Not real certificates: enough for the checks that need no parsing (the PEM markers);
    // tests/service/production.rs uses real ones.
    let junk_cert = pem("junk.crt", "not pem");
    let missing = dir.path().join("missing.pem").to_str().unwrap().to_owned();
    let cert = pem(
        "c.crt",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let cases = [
        // TLS files only with a rediss:// URL.
        (
            format!("redis_url = \"redis://h:1\"\nredis_tls_ca = \"{missing}\""),
            "redis_tls_ca",
            "rediss://",
        ),
        (
            format!("redis_url = \"redis+cluster://h:1,h:2\"\nredis_tls_cert = \"{cert}\""),
            "redis_tls_cert",
            "rediss://",
        ),
        // A certificate with its key, and the other way round.
        (
            format!("redis_url = \"rediss://h:1\"\nredis_tls_cert = \"{cert}\""),
            "redis_tls_key",
            "private key",
        ),
        (
            format!("redis_url = \"rediss://h:1\"\nredis_tls_key = \"{cert}\""),
            "redis_tls_cert",
            "certificate",
        ),
        // Readable PEM files.
        (
            format!("redis_url = \"rediss://h:1\"\nredis_tls_ca = \"{missing}\""),
            "redis_tls_ca",
            "missing.pem",
        ),
        (
            format!("redis_url = \"rediss://h:1\"\nredis_tls_ca = \"{junk_cert}\""),
            "redis_tls_ca",
            "not a PEM certificate",
        ),
        (
            format!("redis_url = \"rediss://h:1\"\nredis_tls_ca = \"{cert}\""),
            "redis_tls_ca",
            "Unable to parse",
        ),
        // The URL naming another CA file than the key.
        (
            format!("redis_url = \"rediss://h:1/?tls_ca=/other.pem\"\nredis_tls_ca = \"{cert}\""),
            "redis_url",
            "twice",
        ),
    ];
    for (text, key, words) in cases {
        let e = load_str(&text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        assert!(e.to_string().contains(words), "{text}: {e}");
    }
    // No TLS key: the URL is left as written.
    let s = load_str("redis_url = \"rediss://h:1\"", env()).unwrap();
    assert_eq!(s.config.redis_url, "rediss://h:1");
}

#[test]
fn telemetry_and_log_format_are_checked_naming_their_key() {
    let s = load_str("", env()).unwrap();
    assert_eq!(s.log_format, LogFormat::Text);
    assert_eq!(s.telemetry, TelemetryOptions::default());
    assert_eq!(s.telemetry.traces_url(), None);
    let s = load_str(
        "log_format = \"json\"\n[telemetry]\notlp_endpoint = \"http://u:pw@collector:4318/\"\n\
         service_name = \"shop-delayq\"\nconsumer_span = \"parent\"\nexport_timeout = \"2s\"\n\
         export_interval = \"200ms\"\nmax_queue = 100\n",
        env(),
    )
    .unwrap();
    assert_eq!(s.log_format, LogFormat::Json);
    let t = &s.telemetry;
    assert_eq!(
        t.traces_url().as_deref(),
        Some("http://u:pw@collector:4318/v1/traces")
    );
    assert_eq!(t.service_name(), Some("shop-delayq"));
    assert_eq!(t.consumer_span, crate::engine::trace::ConsumerSpan::Parent);
    assert_eq!(t.export_timeout, Duration::from_secs(2));
    assert_eq!(t.export_interval, Duration::from_millis(200));
    // The batch never exceeds the queue.
    assert_eq!((t.max_queue, t.export_batch()), (100, 100));
    // Credentials never show.
    assert!(!format!("{s:?}").contains("pw"), "{s:?}");
    for (line, key) in [
        ("log_format = \"yaml\"", "log_format"),
        (
            "[telemetry]\notlp_endpoint = \"collector:4318\"",
            "telemetry.otlp_endpoint",
        ),
        (
            "[telemetry]\notlp_endpoint = \"grpc://c:4317\"",
            "telemetry.otlp_endpoint",
        ),
        (
            "[telemetry]\notlp_endpoint = \"http://c:4318?token=x\"",
            "telemetry.otlp_endpoint",
        ),
        (
            "[telemetry]\nconsumer_span = \"child\"",
            "telemetry.consumer_span",
        ),
        (
            "[telemetry]\nexport_timeout = \"1h\"",
            "telemetry.export_timeout",
        ),
        (
            "[telemetry]\nexport_interval = \"soon\"",
            "telemetry.export_interval",
        ),
        ("[telemetry]\nmax_queue = 0", "telemetry.max_queue"),
        (
            "[telemetry]\nmax_queue = 10\nmax_batch = 11",
            "telemetry.max_batch",
        ),
        ("[telemetry]\nendpoint = \"http://c\"", "endpoint"),
    ] {
        let e = load_str(line, env()).unwrap_err();
        assert!(e.to_string().contains(key), "{line}: {e}");
        assert!(!e.to_string().contains("token=x"), "{e}");
    }
}

/// The queues' default `expires_after` (issue 44): a duration, `0s` clears it; the
/// library's range, refused under its key.
#[test]
fn expires_after_is_checked_naming_its_key() {
    let s = load_str("expires_after = \"30m\"", env()).unwrap();
    assert_eq!(s.expires_after, Some(Duration::from_secs(1800)));
    let s = load_str("expires_after = \"0s\"", env()).unwrap();
    assert_eq!(s.expires_after, Some(Duration::ZERO));
    assert_eq!(load_str("", env()).unwrap().expires_after, None);
    for bad in ["\"-1s\"", "\"3654d\"", "\"soon\"", "\"1us\"", "5"] {
        let e = load_str(&format!("expires_after = {bad}"), env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("expires_after"), "{bad}: {e}");
    }
}

mod handlers;
