//! The configuration's handler sections: the order-close handler, recurring schedules,
//! handlers over several queues, pull groups and cancel_on rules.

use super::*;

const CLOSE: &str = r#"
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "order-close"
database_url = "sqlite://orders.db"
"#;

#[test]
fn an_order_close_handler_turns_reconciliation_on() {
    let s = load_str(CLOSE, env()).unwrap();
    assert_eq!(
        s.handlers[0].kind,
        HandlerKind::OrderClose {
            database_url: "sqlite://orders.db".into()
        }
    );
    let r = s.reconciliation.unwrap();
    assert_eq!(
        (r.queue.as_str(), r.database_url.as_str()),
        ("order-close", "sqlite://orders.db")
    );
    assert_eq!(
        (r.options.cron.as_str(), r.options.grace),
        ("*/30 * * * * *", Duration::from_secs(60))
    );
    let off = format!("{CLOSE}\n[reconciliation]\nenabled = false\n");
    assert!(load_str(&off, env()).unwrap().reconciliation.is_none());
    // Without an order-close handler it is off unless asked for.
    assert!(load_str(GOOD, env()).unwrap().reconciliation.is_none());
}

#[test]
fn order_close_errors_name_the_key() {
    let cases = [
        (
            CLOSE.replace("database_url = \"sqlite://orders.db\"", ""),
            "handlers[0].database_url",
        ),
        (
            CLOSE.replace("sqlite://orders.db", "mysql://db/orders"),
            "handlers[0].database_url",
        ),
        (
            format!("{CLOSE}\n[reconciliation]\ngrace = \"soon\"\n"),
            "reconciliation.grace",
        ),
        (
            format!("{CLOSE}\n[reconciliation]\ncron = \"* * * * *\"\n"),
            "reconciliation.cron",
        ),
        (
            format!("{CLOSE}\n[reconciliation]\ngrase = \"1m\"\n"),
            "grase",
        ),
        (
            "[reconciliation]\nenabled = true\n".to_owned(),
            "reconciliation.database_url",
        ),
        (
            GOOD.replace(
                "secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"",
                "database_url = \"sqlite://x.db\"",
            ),
            "handlers[0].database_url",
        ),
    ];
    for (text, key) in cases {
        let e = load_str(&text, env()).unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
}

/// `[reconciliation]` holds the reconciler's `ReconcileOptions` (`cron`, `grace`,
/// `batch`) beside its own keys: the values reach the options as they are, errors name
/// `reconciliation.<key>` and list every key of the table, and a bad value is refused even
/// while reconciliation is off (it used to pass unread).
#[test]
fn reconciliation_embeds_the_reconcilers_options() {
    use crate::orders::reconcile::ReconcileOptions;
    let text = format!(
        "{CLOSE}\n[reconciliation]\ngrace = \"2m\"\ncron = \"*/5 * * * * *\"\nbatch = 10\n"
    );
    let r = load_str(&text, env()).unwrap().reconciliation.unwrap();
    let want = ReconcileOptions::default()
        .grace(Duration::from_secs(120))
        .cron("*/5 * * * * *")
        .batch(10);
    assert_eq!(r.options, want);
    let all = "(known: enabled, database_url, queue, group, cron, grace, batch)";
    for (text, key, words) in [
        (
            format!("{CLOSE}\n[reconciliation]\nbatch = 0\n"),
            "reconciliation.batch",
            "must be 1..=1000",
        ),
        (
            format!("{CLOSE}\n[reconciliation]\nbatch = \"x\"\n"),
            "reconciliation.batch",
            "found a string",
        ),
        (
            "[reconciliation]\ngrace = \"soon\"\n".to_owned(),
            "reconciliation.grace",
            "is not a duration",
        ),
        (
            "[reconciliation]\ngrase = \"1m\"\n".to_owned(),
            "reconciliation.grase",
            all,
        ),
        (
            "[reconciliation]\n\"<options>\" = { grace = \"1m\" }\n".to_owned(),
            "reconciliation.<options>",
            all,
        ),
    ] {
        let e = load_str(&text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        assert!(e.to_string().contains(words), "{text}: {e}");
    }
}

/// A handler's worker keys are the library's `WorkerOptions` (`timeout` is its
/// `handler_timeout`, `priority_weights` its `priority`): unset keys keep its defaults, the
/// values reach it as they are, and its limits are refused under the entry's key.
#[test]
fn a_handlers_worker_options_are_the_library_type() {
    use crate::engine::backoff::Backoff;
    use crate::engine::worker::WorkerOptions;
    let text =
        "shutdown_grace = \"3s\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\n";
    let s = load_str(text, env()).unwrap();
    let grace = Duration::from_secs(3);
    assert_eq!(
        s.handlers[0].worker,
        WorkerOptions::default().shutdown_grace(grace)
    );
    let s = load_str(
        &format!(
            "{text}concurrency = 3\ntimeout = \"5s\"\nmax_attempts = 2\nbackoff = \"fixed:1s\"\n\
             visibility_timeout = \"1m\"\nprefetch = 0\nrate_limit = \"10/s\"\n\
             priority_weights = [3, 2, 1]\n"
        ),
        env(),
    )
    .unwrap();
    let want = WorkerOptions::default()
        .shutdown_grace(grace)
        .concurrency(3)
        .handler_timeout(Duration::from_secs(5))
        .max_attempts(2)
        .backoff(Backoff::parse("fixed:1s").unwrap())
        .visibility_timeout(Duration::from_secs(60))
        .prefetch(0)
        .rate_limit(crate::engine::flow::RateLimit::parse("10/s").unwrap())
        .priority(PriorityMode::Weighted(vec![3, 2, 1]));
    assert_eq!(s.handlers[0].worker, want);
    let keyed = load_str(&format!("{text}key_concurrency = 4\n"), env()).unwrap();
    assert_eq!(
        keyed.handlers[0].worker,
        WorkerOptions::default()
            .shutdown_grace(grace)
            .key_concurrency(4)
    );
    for (line, key) in [
        (
            "visibility_timeout = \"29ms\"",
            "handlers[0].visibility_timeout",
        ),
        ("visibility_timeout = \"30ms\"", ""),
        ("concurrency = 0", "handlers[0].concurrency"),
        ("concurrency = 10001", "handlers[0].concurrency"),
        ("concurrency = -1", "handlers.0.concurrency"),
        ("timeout = \"0s\"", "handlers[0].timeout"),
        ("timeout = \"soon\"", "handlers[0].timeout"),
        ("timeout = 5", "handlers.0.timeout"),
        ("prefetch = 10001", "handlers[0].prefetch"),
        ("max_attempts = 0", "handlers[0].max_attempts"),
        ("rate_limit = \"5/y\"", "handlers[0].rate_limit"),
        ("priority_weights = [6, 1]", "handlers[0].priority_weights"),
        ("block = \"1s\"", "handlers.0.block"),
        ("key_concurrency = 0", "handlers[0].key_concurrency"),
        ("key_concurrency = -1", "handlers.0.key_concurrency"),
        ("key_concurrency = 10001", "handlers[0].key_concurrency"),
        ("key_concurrency = 5", ""),
        ("key_sequence = true", ""),
        (
            "key_sequence = true\nkey_concurrency = 2",
            "handlers[0].key_sequence",
        ),
        ("\"<written>\" = []", "handlers.0.<written>"),
    ] {
        let r = load_str(&format!("{text}{line}\n"), env());
        match (key, r) {
            ("", r) => assert!(r.is_ok(), "{line}: {:?}", r.err()),
            (key, Err(e)) => assert_eq!(e.key.as_deref(), Some(key), "{line}: {e}"),
            (key, Ok(_)) => panic!("{line} accepted; expected an error at {key}"),
        }
    }
    // A pull group refuses a handler's own key even set to its default.
    let e = load_str(
        "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"pull\"\nconcurrency = 16\n",
        env(),
    )
    .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("handlers[0].concurrency"), "{e}");
}

#[test]
fn schedules_are_checked_naming_their_field_and_their_queues_created() {
    let ok = load_str(
        r#"
[[schedules]]
queue = "reports"
id = "nightly"
cron = "0 0 2 * * *"
timezone = "Europe/Berlin"
start = "2030-01-01T00:00:00Z"
payload = { kind = "nightly" }
"#,
        env(),
    )
    .unwrap();
    assert_eq!(ok.schedules.len(), 1);
    assert_eq!(ok.schedules[0].start_ms, Some(1_893_456_000_000));
    assert_eq!(ok.schedules[0].payload.as_str(), r#"{"kind":"nightly"}"#);
    assert!(ok.queues.contains(&"reports".to_owned()), "{:?}", ok.queues);
    for (body, key) in [
        (r#"cron = "61 * * * * *""#, "schedules[0].cron"),
        (r#"every = "10ms""#, "schedules[0].every"),
        (
            r#"every = "1s"
timezone = "Mars/Olympus""#,
            "schedules[0].timezone",
        ),
        (
            r#"every = "1s"
missed = "often""#,
            "schedules[0].missed",
        ),
        (
            r#"every = "1s"
start = "yesterday""#,
            "schedules[0].start",
        ),
    ] {
        let text = format!("[[schedules]]\nqueue = \"q\"\nid = \"x\"\n{body}\n");
        let e = load_str(&text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{e}");
    }
}

#[test]
fn handlers_over_several_queues_and_priority_weights() {
    let many = GOOD.replace(
        "queue = \"order-close\"",
        "queues = [\"urgent\", \"bulk\"]\nqueue_weights = [3, 1]\npriority_weights = [6, 3, 1]",
    );
    let s = load_str(&many, env()).unwrap();
    let h = &s.handlers[0];
    assert_eq!(h.queues, vec!["urgent", "bulk"]);
    assert_eq!(h.queue_mode, PriorityMode::Weighted(vec![3, 1]));
    assert_eq!(h.worker.priority, PriorityMode::Weighted(vec![6, 3, 1]));
    assert!(s.queues.contains(&"urgent".to_owned()) && s.queues.contains(&"bulk".to_owned()));
    let bad = [
        (
            many.replace("queue_weights = [3, 1]", "queue_weights = [3]"),
            "handlers[0].queue_weights",
        ),
        (
            many.replace(
                "priority_weights = [6, 3, 1]",
                "priority_weights = [6, 0, 1]",
            ),
            "handlers[0].priority_weights",
        ),
        (
            many.replace("[\"urgent\", \"bulk\"]", "[\"urgent\", \"urgent\"]"),
            "handlers[0].queues",
        ),
        (
            many.replace("queues = [", "queue = \"x\"\nqueues = ["),
            "handlers[0].queues",
        ),
        (
            GOOD.replace("queue = \"order-close\"\n", ""),
            "handlers[0].queue",
        ),
        (
            GOOD.replace("concurrency = 16", "concurrency = 16\nqueue_weights = [1]"),
            "handlers[0].queue_weights",
        ),
    ];
    for (text, key) in bad {
        let e = load_str(&text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{e}");
    }
}

#[test]
fn a_pull_group_takes_its_worker_options_and_refuses_a_handlers_own() {
    let base =
        "redis_url = \"redis://x\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"pull\"\n";
    let s = load_str(
        &format!("{base}max_attempts = 3\nbackoff = \"fixed:1s\"\nlease = \"2m\"\n"),
        env(),
    )
    .unwrap();
    let h = &s.handlers[0];
    assert_eq!(
        h.kind,
        HandlerKind::Pull {
            lease: std::time::Duration::from_secs(120)
        }
    );
    assert_eq!(h.kind.name(), "pull");
    assert_eq!(h.worker.max_attempts, 3);
    // Slots per order key apply to pull groups as to workers.
    let keyed = load_str(&format!("{base}key_concurrency = 2\n"), env()).unwrap();
    assert_eq!(keyed.handlers[0].worker.key_concurrency, Some(2));
    let d = load_str(base, env()).unwrap();
    assert_eq!(
        d.handlers[0].kind,
        HandlerKind::Pull {
            lease: crate::engine::worker::DEFAULT_LEASE
        }
    );
    for (line, key) in [
        ("concurrency = 4", "handlers[0].concurrency"),
        ("timeout = \"5s\"", "handlers[0].timeout"),
        ("prefetch = 4", "handlers[0].prefetch"),
        ("lease = \"10ms\"", "handlers[0].lease"),
        ("lease = \"13h\"", "handlers[0].lease"),
        ("url = \"http://127.0.0.1:9/\"", "handlers[0].url"),
    ] {
        let e = load_str(&format!("{base}{line}\n"), env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{line}: {e}");
    }
    // A lease is for pull groups only.
    let e = load_str(
        "redis_url = \"redis://x\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\nlease = \"1m\"\n",
        env(),
    )
    .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("handlers[0].lease"));
}

#[test]
fn cancel_on_rules_are_checked_naming_their_key_and_set_per_queue() {
    let s = load_str(
        "queues = [\"order-close\", \"reminder\", \"webhooks\"]\ncancel_on = [{ event = \"order.paid\", match = \"order_id\", queues = [\"order-close\", \"reminder\"] }, { event = \"order.refunded\", match = [\"order_id\"], remember = \"1h\" }]",
        env(),
    )
    .unwrap();
    let per: Vec<(String, usize)> = s
        .cancel_on
        .unwrap()
        .into_iter()
        .map(|(q, r)| (q, r.len()))
        .collect();
    let want = [("order-close", 2), ("reminder", 2), ("webhooks", 1)];
    assert_eq!(per, want.map(|(q, n)| (q.to_owned(), n)));
    assert!(
        load_str("queues = [\"q\"]", env())
            .unwrap()
            .cancel_on
            .is_none()
    );
    for bad in [
        "cancel_on = [{ event = \"order.paid\" }]",
        "cancel_on = [{ event = \"order.paid\", match = \"$.a\" }]",
        "cancel_on = [{ event = \"order.paid\", match = \"a\", queues = [\"nope\"] }]",
    ] {
        let e = load_str(&format!("queues = [\"q\"]\n{bad}"), env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("cancel_on"), "{bad}: {e}");
    }
}
