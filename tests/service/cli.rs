//! The `delayq` command line, run as a real process against a private redis-server: output
//! and exit code of every verb, including invalid input (exit 2, nothing written) and an
//! unreachable Redis (exit 3).
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{Delivery, Dispatcher, DispatcherOptions, HandlerError, When, Worker, WorkerOptions};
use serde_json::{Value, json};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::{raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_delayq");

pub(crate) struct Out {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Out {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {:?}", self.stdout))
    }
}

pub(crate) fn run(url: &str, args: &[&str]) -> Out {
    let o = Command::new(BIN)
        .arg("--redis-url")
        .arg(url)
        .args(args)
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[tokio::test]
async fn schedule_get_cancel() {
    let (s, client) = start().await;
    let url = s.url();
    let o = run(
        &url,
        &[
            "schedule",
            "order-close",
            "o1",
            "--in",
            "15m",
            "--payload",
            r#"{"user":7}"#,
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = o.json();
    assert_eq!(
        (&j["queue"], &j["id"], &j["outcome"]),
        (&json!("order-close"), &json!("o1"), &json!("created"))
    );
    let due = j["due_at_ms"].as_i64().unwrap();
    assert!((due - client.now_ms() - 900_000).abs() < 60_000, "{due}");

    let o = run(
        &url,
        &[
            "schedule",
            "order-close",
            "o1",
            "--at",
            "2030-01-01T00:00:00+01:00",
        ],
    );
    assert_eq!((o.code, o.json()["outcome"].clone()), (0, json!("updated")));
    assert_eq!(o.json()["due_at_ms"], json!(1_893_452_400_000_i64));
    let o = run(
        &url,
        &[
            "schedule",
            "order-close",
            "o1",
            "--at",
            "1893452400000",
            "--if-absent",
        ],
    );
    assert_eq!(
        (o.code, o.json()["outcome"].clone()),
        (0, json!("unchanged"))
    );

    let o = run(&url, &["get", "order-close", "o1"]);
    assert_eq!(o.code, 0);
    assert_eq!(
        o.json(),
        json!({"queue": "order-close", "id": "o1", "state": "scheduled",
               "due_at_ms": 1_893_452_400_000_i64, "payload": null, "dispatched_at_ms": null,
               "entry_id": null, "groups": [], "priority": "normal"})
    );
    assert_eq!(run(&url, &["get", "order-close", "nope"]).code, 1);

    let o = run(&url, &["cancel", "order-close", "o1"]);
    assert_eq!((o.code, o.json()), (0, json!({"outcome": "cancelled"})));
    let o = run(&url, &["cancel", "order-close", "o1"]);
    assert_eq!((o.code, o.json()), (1, json!({"outcome": "not_found"})));
}

#[tokio::test]
async fn invalid_input_exits_2_names_the_problem_and_writes_nothing() {
    let (s, client) = start().await;
    let url = s.url();
    let before = support::snapshot(&client).await;
    let cases: &[(&[&str], &str)] = &[
        (&["schedule", "bad:queue", "o", "--in", "1s"], "queue"),
        (&["schedule", "q", "", "--in", "1s"], "id"),
        (&["schedule", "q", "o", "--in", "-5s"], "--in"),
        (&["schedule", "q", "o", "--in", "soon"], "--in"),
        (&["schedule", "q", "o", "--at", "1795000000"], "seconds"),
        (
            &["schedule", "q", "o", "--at", "2030-01-01T00:00:00"],
            "ambiguous",
        ),
        (
            &["schedule", "q", "o", "--at", "2040-13-01T00:00:00Z"],
            "due time",
        ),
        (
            &["schedule", "q", "o", "--in", "1s", "--payload", "{nope"],
            "payload",
        ),
        (&["schedule", "q", "o", "--in", "20y"], "--in"),
        (&["schedule", "q", "o"], "--in"),
        (&["get", "q", "a\u{1}b"], "id"),
        (&["cancel", "", "o"], "queue"),
        (&["dead", "replay", "q"], "--all"),
        (&["dead", "list", "q", "--group", ""], "group"),
        (&["stats", "bad queue"], "queue"),
        (
            &["schedule", "q", "o", "--in", "1s", "--priority", "bogus"],
            "--priority",
        ),
        // A value that looks like a flag still reaches the one rule: named, with the levels.
        (
            &["schedule", "q", "o", "--in", "1s", "--priority", "-1"],
            "--priority",
        ),
        (
            &["schedule", "q", "o", "--in", "1s", "--priority", "-1"],
            "\"-1\" is not high, normal or low",
        ),
    ];
    for (args, needle) in cases {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {} {}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(needle),
            "{args:?}: stderr {:?} lacks {needle:?}",
            o.stderr
        );
    }
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "invalid input wrote something"
    );
}

#[tokio::test]
async fn an_unreachable_redis_exits_3() {
    let o = run("redis://127.0.0.1:1", &["get", "q", "o"]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(!o.stderr.is_empty());
}

#[tokio::test]
async fn stats_as_json_and_table() {
    let (s, client) = start().await;
    let url = s.url();
    client
        .schedule("order-close", "late", When::in_ms(0), json!(1))
        .await
        .unwrap();
    client
        .schedule("order-close", "later", When::in_ms(3_600_000), json!(1))
        .await
        .unwrap();
    client
        .schedule("notify", "n1", When::in_ms(3_600_000), json!(1))
        .await
        .unwrap();
    let w = Worker::new(
        &client,
        "order-close",
        "close",
        |_d: Delivery| async { Ok(()) },
        WorkerOptions::default(),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();

    let o = run(&url, &["stats", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = o.json();
    let queues = j["queues"].as_array().unwrap();
    // Every registered queue (the test declared three), the empty one too.
    assert_eq!(queues.len(), support::QUEUES.len());
    let q = queues.iter().find(|q| q["queue"] == "order-close").unwrap();
    assert_eq!(
        (q["scheduled"].clone(), q["overdue"].clone()),
        (json!(2), json!(1))
    );
    assert!(q["oldest_overdue_ms"].as_i64().unwrap() >= 0);
    assert!(q["next_due_at_ms"].as_i64().is_some());
    assert_eq!(
        (q["stream_length"].clone(), q["dead"].clone()),
        (json!(0), json!(0))
    );
    assert_eq!(
        q["groups"],
        json!([{"group": "close", "pending": 0, "lag": 0, "consumers": 0, "idle_ms": null, "paused": false}])
    );

    let o = run(&url, &["stats", "notify", "--json"]);
    assert_eq!(o.json()["queues"].as_array().unwrap().len(), 1);
    let o = run(&url, &["stats"]);
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.contains("order-close") && o.stdout.contains("group close"),
        "{}",
        o.stdout
    );
}

#[tokio::test]
async fn dead_list_replay_purge() {
    let (s, client) = start().await;
    let url = s.url();
    let w = Worker::new(
        &client,
        "order-close",
        "webhook",
        |_d: Delivery| async { Err(HandlerError::permanent("partner said 410")) },
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let st = w.stats();
    let cancel = CancellationToken::new();
    w.ensure_groups().await.unwrap();
    let h = tokio::spawn(w.run(cancel.clone()));
    for id in ["o1", "o2", "o3"] {
        client
            .schedule("order-close", id, When::in_ms(0), json!({"id": id}))
            .await
            .unwrap();
    }
    Dispatcher::new(&client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    wait_for("three dead letters", Duration::from_secs(60), || {
        let n = st.dead_lettered.load(Ordering::SeqCst);
        async move { n == 3 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();

    let o = run(&url, &["dead", "list", "order-close", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        for k in [
            "entry_id",
            "queue",
            "id",
            "group",
            "attempts",
            "last_error",
            "dead_at_ms",
            "due_at_ms",
            "payload",
        ] {
            assert!(l.get(k).is_some(), "{k} missing in {l}");
        }
        assert_eq!(
            (l["group"].clone(), l["last_error"].clone()),
            (json!("webhook"), json!("partner said 410"))
        );
        assert_eq!(l["payload"]["id"], l["id"]);
    }
    let o = run(
        &url,
        &["dead", "list", "order-close", "--group", "other", "--json"],
    );
    assert_eq!((o.code, o.stdout.as_str()), (0, ""));

    let first = lines[0]["entry_id"].as_str().unwrap();
    let o = run(&url, &["dead", "replay", "order-close", first]);
    assert_eq!((o.code, o.json()), (0, json!({"replayed": 1})));
    let o = run(
        &url,
        &[
            "dead",
            "purge",
            "order-close",
            "--group",
            "webhook",
            "--all",
        ],
    );
    assert_eq!((o.code, o.json()), (0, json!({"purged": 2})));
    let o = run(&url, &["dead", "list", "order-close"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""));
    let len: i64 = raw(&client, &["XLEN", "{dq:order-close:0}:stream"]).await;
    assert_eq!(len, 4, "three dispatched + one replayed");
}

#[tokio::test]
async fn demo_with_no_redis_starts_its_own_and_handles_every_unpaid_order() {
    // Nothing listens on port 1: the demo must start a throwaway redis-server.
    let o = run(
        "redis://127.0.0.1:1",
        &["demo", "--orders", "300", "--window", "1s"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("throwaway"), "{}", o.stderr);
    let last = o.stdout.lines().last().unwrap();
    let s: Value = serde_json::from_str(last).unwrap();
    let (created, paid) = (s["created"].as_u64().unwrap(), s["paid"].as_u64().unwrap());
    assert_eq!(created, 300);
    assert!(paid > 0 && paid < 300, "{s}");
    // Read back from the orders database (a temporary SQLite file by default).
    assert_eq!(s["closed"].as_u64().unwrap(), created - paid);
    assert_eq!(s["pending"].as_u64().unwrap(), 0);
    assert!(
        s["database"].as_str().unwrap().starts_with("sqlite://"),
        "{s}"
    );
    assert_eq!(s["notified"].as_u64().unwrap(), created - paid);
    let o = run("redis://127.0.0.1:1", &["demo", "--paid-percent", "101"]);
    assert_eq!(o.code, 2);
    let o = run(
        "redis://127.0.0.1:1",
        &["demo", "--database-url", "mysql://db/orders"],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("database_url"), "{}", o.stderr);
}

#[tokio::test]
async fn migrate_applies_the_schema_idempotently_on_both_backends() {
    for t in support::db::TestDb::all().await {
        for _ in 0..2 {
            let o = run(
                "redis://127.0.0.1:1",
                &["migrate", "--database-url", &t.url],
            );
            assert_eq!(o.code, 0, "{}: {}", t.backend, o.stderr);
            let v = o.json();
            assert_eq!(v["outcome"], "migrated");
            assert_eq!(v["backend"], t.backend);
        }
        // The schema is there: the orders table accepts a row.
        let db = delayq::orders::db::Db::connect(&t.url).await.unwrap();
        let orders = delayq::Orders::new(db.clone());
        assert!(orders.create("o-1", 1, 1, 2).await.unwrap());
        db.close().await;
    }
    let o = run(
        "redis://127.0.0.1:1",
        &["migrate", "--database-url", "mysql://db/orders"],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = run(
        "redis://127.0.0.1:1",
        &[
            "migrate",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
        ],
    );
    assert_eq!(
        o.code, 3,
        "an unreachable database is a runtime failure: {}",
        o.stderr
    );
}

#[tokio::test]
async fn bench_scripts_measures_each_script_at_each_batch_size_and_moves_every_order() {
    let (s, client) = start().await;
    let o = run(
        &s.url(),
        &[
            "bench",
            "--scenario",
            "scripts",
            "--orders",
            "200",
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let report: Value = serde_json::from_str(o.stdout.trim()).unwrap();
    assert_eq!(report["scenario"], json!("scripts"));
    let notes = report["notes"].as_str().unwrap();
    for script in ["dequeue.lua", "read.lua"] {
        for batch in [0, 1, 10, 100, 1000] {
            let line = notes
                .lines()
                .find(|l| {
                    l.trim_start()
                        .starts_with(&format!("{script} batch {batch}:"))
                })
                .unwrap_or_else(|| panic!("no {script} batch {batch} in {notes}"));
            assert!(line.contains("µs per call"), "{line}");
        }
    }
    // Each size moves max(200, batch) orders through dequeue.lua and reads them back with
    // read.lua: 200 + 200 + 200 + 1,000, twice.
    assert_eq!(report["n"], json!(3200));
    // It cleaned up after itself.
    let left: Vec<String> = support::raw(&client, &["KEYS", "*"]).await;
    assert_eq!(support::data_keys(&client).await, 0, "{left:?}");
}

#[tokio::test]
async fn bench_reports_every_field_and_loses_nothing() {
    let (s, client) = start().await;
    let o = run(
        &s.url(),
        &[
            "bench",
            "--scenario",
            "spread,storm,enqueue,ceiling",
            "--orders",
            "2000",
            "--lead",
            "1s",
            "--window",
            "1s",
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for l in &lines {
        for k in [
            "scenario",
            "n",
            "enqueue_s",
            "enqueue_rate",
            "enqueue_done_offset_ms",
            "mem_before",
            "mem_after",
            "mem_per_order_bytes",
            "processed",
            "handled",
            "duplicates",
            "missing",
            "early_count",
            "late_min_ms",
            "late_p50_ms",
            "late_p90_ms",
            "late_p99_ms",
            "late_max_ms",
            "first_handled_ms",
            "last_handled_ms",
            "drain_s",
            "drain_rate",
            "redis_cpu_us_per_order",
            "timed_out",
            "notes",
        ] {
            assert!(l.get(k).is_some(), "{k} missing in {l}");
        }
    }
    for l in &lines[..2] {
        assert_eq!(
            (
                l["handled"].clone(),
                l["duplicates"].clone(),
                l["missing"].clone()
            ),
            (json!(2000), json!(0), json!(0)),
            "{l}"
        );
        assert_eq!(l["timed_out"], json!(false));
    }
    assert!(lines[1]["drain_rate"].as_f64().unwrap() > 0.0);
    assert!(
        lines[3]["notes"]
            .as_str()
            .unwrap()
            .contains("raw pipelined ZADD")
    );
    // It cleaned up after itself.
    let left: Vec<String> = support::raw(&client, &["KEYS", "*"]).await;
    assert_eq!(support::data_keys(&client).await, 0, "{left:?}");
}

/// The bench's JSON lines, parsed.
fn bench_lines(o: &Out) -> Vec<Value> {
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn bench_seed_runs_the_seed_design_moves_every_order_and_prints_the_ratio() {
    let (s, client) = start().await;
    let o = run(
        &s.url(),
        &[
            "bench",
            "--scenario",
            "spread,seed,seed-storm",
            "--orders",
            "600",
            "--lead",
            "1s",
            "--window",
            "1s",
            "--json",
        ],
    );
    let lines = bench_lines(&o);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["spread", "seed", "seed-storm", "spread/seed"]);
    for l in &lines[1..3] {
        // Every order moved and read once, nothing left in the ZSET, the HASH or pending.
        assert_eq!(
            (
                l["n"].clone(),
                l["handled"].clone(),
                l["duplicates"].clone(),
                l["missing"].clone(),
                l["timed_out"].clone()
            ),
            (json!(600), json!(600), json!(0), json!(0), json!(false)),
            "{l}"
        );
        let notes = l["notes"].as_str().unwrap();
        assert!(
            notes.contains("left behind: 0 due, 0 payloads, 0 unacknowledged"),
            "{notes}"
        );
        // One enqueue call per order, plus the poller's calls.
        assert!(l["script_calls_per_order"].as_f64().unwrap() > 1.0, "{l}");
        assert!(l["redis_cpu_us_per_order"].as_f64().unwrap() > 0.0, "{l}");
    }
    assert!(lines[2]["drain_rate"].as_f64().unwrap() > 0.0);
    assert!(lines[1]["drain_rate"].is_null());
    // The ratio is the two reports' Redis CPU per order.
    let ratio = lines[3]["cpu_ratio"].as_f64().unwrap();
    let expected = lines[0]["redis_cpu_us_per_order"].as_f64().unwrap()
        / lines[1]["redis_cpu_us_per_order"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9, "{ratio} vs {expected}");
    let left: Vec<String> = support::raw(&client, &["KEYS", "*"]).await;
    assert_eq!(support::data_keys(&client).await, 0, "{left:?}");
}

#[tokio::test]
async fn bench_idle_runs_serve_processes_measures_them_and_stops_them() {
    let (s, client) = start().await;
    let clients = |c: delayq::Client| async move {
        let list: String = support::raw(&c, &["CLIENT", "LIST"]).await;
        list.lines().count()
    };
    let before = clients(client.clone()).await;
    let o = run(
        &s.url(),
        &[
            "bench",
            "--scenario",
            "idle",
            "--queues",
            "3",
            "--shards",
            "2",
            "--processes",
            "2",
            "--window",
            "1s",
            "--json",
        ],
    );
    let lines = bench_lines(&o);
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert_eq!(l["scenario"], json!("idle"));
    assert_eq!(l["n"], json!(3));
    let notes = l["notes"].as_str().unwrap();
    assert!(
        notes.contains("3 queue(s) x 2 shard(s) x 2 delayq serve process(es)"),
        "{notes}"
    );
    // Two serves polling six shards: Redis saw their calls.
    assert!(l["commands_per_s"].as_f64().unwrap() > 0.0, "{l}");
    assert!(l["redis_cpu_ms_per_s"].as_f64().unwrap() > 0.0, "{l}");
    // The serves were stopped: only this test's connections are left, and no keys.
    wait_for("the serves to disconnect", Duration::from_secs(30), || {
        let c = client.clone();
        async move { clients(c).await == before }
    })
    .await;
    let left: Vec<String> = support::raw(&client, &["KEYS", "*"]).await;
    assert_eq!(support::data_keys(&client).await, 0, "{left:?}");
}

#[tokio::test]
async fn bench_cross_schedules_from_another_process_and_every_order_arrives_once() {
    let (s, client) = start().await;
    let o = run(
        &s.url(),
        &[
            "bench",
            "--scenario",
            "cross",
            "--orders",
            "60",
            "--window",
            "1s",
            "--json",
        ],
    );
    let lines = bench_lines(&o);
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert_eq!(l["scenario"], json!("cross"));
    assert_eq!(
        (
            l["handled"].clone(),
            l["duplicates"].clone(),
            l["missing"].clone(),
            l["timed_out"].clone()
        ),
        (json!(60), json!(0), json!(0), json!(false)),
        "{l}"
    );
    // Lateness is measured against the due times the producer chose.
    for k in ["late_min_ms", "late_p50_ms", "late_p99_ms", "late_max_ms"] {
        assert!(l[k].is_number(), "{k}: {l}");
    }
    assert!(l["late_max_ms"].as_f64().unwrap() >= l["late_p99_ms"].as_f64().unwrap());
    let left: Vec<String> = support::raw(&client, &["KEYS", "*"]).await;
    assert_eq!(support::data_keys(&client).await, 0, "{left:?}");
}

#[tokio::test]
async fn queues_are_created_listed_and_deleted_and_every_verb_sees_every_shard() {
    let (s, client) = start().await;
    let url = s.url();
    // An unknown queue: exit 1, one line naming it, nothing written.
    let before = support::snapshot(&client).await;
    for args in [
        &["schedule", "typo-queue", "o1", "--in", "1s"][..],
        &["get", "typo-queue", "o1"],
        &["cancel", "typo-queue", "o1"],
        &["stats", "typo-queue"],
        &["dead", "list", "typo-queue"],
        &["queue", "delete", "typo-queue"],
    ] {
        let o = run(&url, args);
        assert_eq!(o.code, 1, "{args:?}: {} {}", o.stdout, o.stderr);
        assert!(o.stderr.contains("typo-queue"), "{args:?}: {}", o.stderr);
        assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    }
    assert_eq!(support::snapshot(&client).await, before);

    let o = run(&url, &["queue", "create", "wide", "--shards", "8"]);
    assert_eq!(
        (o.code, o.json()),
        (0, json!({"queue": "wide", "shards": 8, "created": true}))
    );
    let o = run(&url, &["queue", "create", "wide", "--shards", "8"]);
    assert_eq!((o.code, o.json()["created"].clone()), (0, json!(false)));
    let o = run(&url, &["queue", "create", "wide", "--shards", "2"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = run(&url, &["queue", "list"]);
    assert_eq!(o.code, 0);
    let listed: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        listed.contains(&json!({"queue": "wide", "shards": 8, "paused": false,
                                "history_retention_ms": 86_400_000, "dedup_window_ms": 0})),
        "{listed:?}"
    );

    // The CLI reads the shard count from the registry: all 8 shards are seen.
    for i in 0..40 {
        let o = run(&url, &["schedule", "wide", &format!("o{i}"), "--in", "1h"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let shards_used: std::collections::HashSet<u16> = (0..40)
        .map(|i| delayq::engine::keys::shard_of(&format!("o{i}"), 8))
        .collect();
    assert!(shards_used.len() > 4);
    let o = run(&url, &["stats", "wide", "--json"]);
    assert_eq!(o.json()["queues"][0]["scheduled"], json!(40));
    for i in 0..40 {
        let o = run(&url, &["get", "wide", &format!("o{i}")]);
        assert_eq!(o.code, 0, "o{i}: {}", o.stderr);
    }

    // Delete: refused while it holds work (exit 2), then forced.
    let o = run(&url, &["queue", "delete", "wide"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = run(&url, &["queue", "delete", "wide", "--force"]);
    assert_eq!((o.code, o.json()["scheduled"].clone()), (0, json!(40)));
    let o = run(&url, &["stats", "wide"]);
    assert_eq!(o.code, 1);
}

#[tokio::test]
async fn queues_and_groups_pause_and_resume() {
    let (s, client) = start().await;
    let url = s.url();
    let o = run(&url, &["queue", "pause", "order-close"]);
    assert_eq!(
        (o.code, o.json()),
        (
            0,
            json!({"queue": "order-close", "group": null, "paused": true})
        )
    );
    let o = run(&url, &["stats", "order-close", "--json"]);
    assert_eq!(o.json()["queues"][0]["paused"], json!(true));
    let o = run(&url, &["queue", "list"]);
    assert!(
        o.stdout.contains(
            r#"{"queue":"order-close","shards":1,"paused":true,"history_retention_ms":86400000,"dedup_window_ms":0}"#
        ),
        "{}",
        o.stdout
    );
    let o = run(&url, &["queue", "resume", "order-close"]);
    assert_eq!(o.json()["paused"], json!(false));
    // A group must exist; unknown queue or group: exit 1.
    let o = run(&url, &["queue", "pause", "order-close", "--group", "close"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let _: () = raw(
        &client,
        &[
            "XGROUP",
            "CREATE",
            "{dq:order-close:0}:stream",
            "close",
            "0",
            "MKSTREAM",
        ],
    )
    .await;
    let o = run(&url, &["queue", "pause", "order-close", "--group", "close"]);
    assert_eq!(
        (o.code, o.json()),
        (
            0,
            json!({"queue": "order-close", "group": "close", "paused": true})
        )
    );
    let o = run(&url, &["stats", "order-close", "--json"]);
    assert_eq!(o.json()["queues"][0]["groups"][0]["paused"], json!(true));
    let o = run(&url, &["queue", "pause", "typo-queue"]);
    assert_eq!(o.code, 1);
}

#[tokio::test]
async fn queue_list_on_a_fresh_redis_and_after_the_last_delete_prints_nothing() {
    let fresh = delayq::LocalRedis::start().unwrap();
    let o = run(&fresh.url(), &["queue", "list"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    let o = run(&fresh.url(), &["queue", "create", "only"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&fresh.url(), &["queue", "delete", "only"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&fresh.url(), &["queue", "list"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    let o = run(&fresh.url(), &["stats", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[tokio::test]
async fn queue_delete_is_refused_while_a_paused_group_has_unread_entries() {
    let (s, client) = start().await;
    let url = s.url();
    let _: () = raw(
        &client,
        &[
            "XGROUP",
            "CREATE",
            "{dq:q:0}:stream",
            "slow",
            "0",
            "MKSTREAM",
        ],
    )
    .await;
    let o = run(&url, &["queue", "pause", "q", "--group", "slow"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for i in 0..5 {
        let o = run(&url, &["schedule", "q", &format!("o{i}"), "--in", "0s"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    // Dispatched (due now by the CLI's clock: drained until all five are in the stream).
    let d = delayq::Dispatcher::new(&client, "q", delayq::DispatcherOptions::default()).unwrap();
    let d = &d;
    wait_for("five orders dispatched", Duration::from_secs(10), || {
        let c = client.clone();
        async move {
            d.drain().await.unwrap();
            let len: i64 = raw(&c, &["XLEN", "{dq:q:0}:stream"]).await;
            len == 5
        }
    })
    .await;
    let o = run(&url, &["queue", "delete", "q"]);
    assert_eq!(o.code, 2, "{}", o.stdout);
    assert!(o.stderr.contains("5 not yet read"), "{}", o.stderr);
    assert!(o.stderr.contains("slow=5"), "{}", o.stderr);
    let len: i64 = raw(&client, &["XLEN", "{dq:q:0}:stream"]).await;
    assert_eq!(len, 5, "nothing deleted");
}

#[tokio::test]
async fn stats_watch_into_a_closed_pipe_ends_quietly_with_exit_0() {
    let (s, _client) = start().await;
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{BIN} --redis-url {} stats --watch | head -1; exit ${{PIPESTATUS[0]}}",
            s.url()
        ))
        .env_remove("DELAYQ_REDIS_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn scripts_export_writes_every_script_as_the_engine_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["scripts", "export", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), delayq::engine::scripts::all().len());
    let first = lines[0].clone();
    assert_eq!(first["sha1"].as_str().unwrap().len(), 40);
    assert_eq!(first["script"], json!("enqueue"));
    for (name, text) in delayq::engine::scripts::all() {
        let written = std::fs::read_to_string(dir.path().join(format!("{name}.lua"))).unwrap();
        assert_eq!(written, text, "{name}");
        // Every script is its lua/ file, with the includes its header names
        // (lua/include/) put in after its header (and without a read-only script's flags
        // line, which Redis 6.2 does not know).
        let file = std::fs::read_to_string(format!("lua/{name}.lua")).unwrap();
        let engine = delayq::engine::scripts::source(&file);
        assert_eq!(written, delayq::engine::scripts::legacy(&engine), "{name}");
        assert!(
            written.starts_with(&format!("-- {name}.lua: ")),
            "{name}: the header first"
        );
        for (inc, text) in delayq::engine::scripts::resolved_includes(&file) {
            assert_eq!(
                written.matches(text).count(),
                1,
                "{name}: include {inc} once"
            );
        }
    }
}

#[tokio::test]
async fn cron_add_show_list_remove_round_trip() {
    let (s, client) = start().await;
    let url = s.url();
    let o = run(&url, &["queue", "create", "reports"]);
    assert_eq!(o.code, 0, "{}", o.stderr);

    let o = run(
        &url,
        &[
            "cron",
            "add",
            "reports",
            "hourly",
            "--every",
            "1h",
            "--payload",
            r#"{"report":"sales"}"#,
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let added = o.json();
    assert_eq!(
        (&added["queue"], &added["id"], &added["created"]),
        (&json!("reports"), &json!("hourly"), &json!(true))
    );
    let next = added["next_ms"].as_i64().unwrap();
    assert_eq!(next % 3_600_000, 0, "aligned to the hour: {next}");
    assert!(next > client.now_ms() - 1000, "{next}");

    // Declared again: replaced, in the human form (RFC 3339 and ms).
    let o = run(
        &url,
        &[
            "cron",
            "add",
            "reports",
            "hourly",
            "--every",
            "1h",
            "--payload",
            r#"{"report":"sales"}"#,
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.starts_with("replaced"), "{}", o.stdout);
    assert!(o.stdout.contains(&next.to_string()), "{}", o.stdout);

    let o = run(&url, &["cron", "show", "reports", "hourly", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let shown = o.json();
    assert_eq!(shown["next_ms"], json!(next));
    assert_eq!(shown["next_id"], json!(format!("hourly@{next}")));
    assert_eq!(shown["every"], json!("1h"));
    assert_eq!(shown["timezone"], json!("UTC"));
    assert_eq!(shown["payload"], json!({"report": "sales"}));
    let upcoming: Vec<i64> = shown["upcoming_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(upcoming.len(), 5, "{upcoming:?}");
    assert!(upcoming[0] >= next, "{upcoming:?} vs {next}");
    for w in upcoming.windows(2) {
        assert_eq!(w[1] - w[0], 3_600_000, "{upcoming:?}");
    }
    let o = run(&url, &["cron", "show", "reports", "hourly"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("upcoming:"), "{}", o.stdout);
    assert_eq!(
        o.stdout.lines().filter(|l| l.starts_with("  20")).count(),
        5,
        "{}",
        o.stdout
    );

    let o = run(&url, &["cron", "list", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let listed = o.json();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (&listed[0]["queue"], &listed[0]["id"], &listed[0]["next_ms"]),
        (&json!("reports"), &json!("hourly"), &json!(next))
    );
    let o = run(&url, &["cron", "list", "reports"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let row = o.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        row.contains("hourly") && row.contains("every 1h"),
        "{}",
        o.stdout
    );
    let o = run(&url, &["cron", "list", "q", "--json"]);
    assert_eq!((o.code, o.json()), (0, json!([])));

    // The next tick is an ordinary order, scheduled ahead.
    let tick = format!("hourly@{next}");
    let o = run(&url, &["get", "reports", &tick]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        (&o.json()["state"], &o.json()["due_at_ms"]),
        (&json!("scheduled"), &json!(next))
    );
    assert!(client.get("reports", &tick).await.unwrap().is_some());

    let o = run(&url, &["cron", "remove", "reports", "hourly"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["cron", "show", "reports", "hourly"]);
    assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
    assert!(o.stderr.contains("hourly"), "{}", o.stderr);
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    let o = run(&url, &["cron", "remove", "reports", "hourly"]);
    assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
    // The pending tick was taken back with it.
    assert!(client.get("reports", &tick).await.unwrap().is_none());
    assert_eq!(run(&url, &["get", "reports", &tick]).code, 1);
    assert!(
        delayq::Schedules::new(&client)
            .list(None)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn cron_bad_input_exits_2_names_the_field_and_writes_nothing() {
    let (s, client) = start().await;
    let url = s.url();
    let before = support::snapshot(&client).await;
    let cases: &[(&[&str], &str)] = &[
        (&["cron", "add", "q", "c", "--cron", "61 * * * * *"], "cron"),
        (
            &[
                "cron",
                "add",
                "q",
                "c",
                "--every",
                "1h",
                "--timezone",
                "Mars/Olympus",
            ],
            "timezone",
        ),
        (&["cron", "add", "q", "c", "--every", "10ms"], "every"),
        (&["cron", "add", "q", "c", "--every", "soon"], "every"),
        (
            &[
                "cron",
                "add",
                "q",
                "c",
                "--every",
                "1h",
                "--cron",
                "0 * * * * *",
            ],
            "--cron",
        ),
        (&["cron", "add", "q", "c"], "--cron"),
        (
            &[
                "cron", "add", "q", "c", "--every", "1h", "--missed", "bogus",
            ],
            "--missed",
        ),
        (&["cron", "add", "q", "bad:id", "--every", "1h"], "id"),
        (&["cron", "add", "bad queue", "c", "--every", "1h"], "queue"),
        (
            &[
                "cron",
                "add",
                "q",
                "c",
                "--every",
                "1h",
                "--payload",
                "{nope",
            ],
            "payload",
        ),
        (
            &[
                "cron", "add", "q", "c", "--every", "1h", "--start", "tomorrow",
            ],
            "start",
        ),
        (
            &[
                "cron",
                "add",
                "q",
                "c",
                "--every",
                "1h",
                "--start",
                "2031-01-01T00:00:00Z",
                "--end",
                "2030-01-01T00:00:00Z",
            ],
            "end",
        ),
        (
            &["cron", "add", "typo-queue", "c", "--every", "1h"],
            "queue",
        ),
        (&["cron", "show", "q", "bad id"], "id"),
        (&["cron", "remove", "q", ""], "id"),
        (&["cron", "list", "bad queue"], "queue"),
    ];
    for (args, needle) in cases {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {} {}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(needle),
            "{args:?}: stderr {:?} lacks {needle:?}",
            o.stderr
        );
        assert!(o.stdout.is_empty(), "{args:?}: {}", o.stdout);
    }
    let o = run(&url, &["cron", "add", "typo-queue", "c", "--every", "1h"]);
    assert!(o.stderr.contains("not registered"), "{}", o.stderr);
    assert!(o.stderr.contains("delayq queue create"), "{}", o.stderr);

    let keys: Vec<String> = raw(&client, &["KEYS", "*schedule*"]).await;
    assert!(keys.is_empty(), "{keys:?}");
    assert!(
        delayq::Schedules::new(&client)
            .list(None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "invalid input wrote something"
    );
}

#[tokio::test]
async fn cron_pause_and_resume() {
    let redis = delayq::LocalRedis::start().unwrap();
    let url = redis.url();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_delayq"))
            .args(["--redis-url", &url])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(run(&["queue", "create", "reports"]).0, Some(0));
    assert_eq!(
        run(&["cron", "add", "reports", "beat", "--every", "1h"]).0,
        Some(0)
    );
    let (code, out) = run(&["cron", "pause", "reports", "beat"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("paused"), "{out}");
    let (_, shown) = run(&["cron", "show", "reports", "beat", "--json"]);
    let v: serde_json::Value = serde_json::from_str(shown.trim()).unwrap();
    assert_eq!(v["paused"], true);
    assert_eq!(v["next_ms"], serde_json::Value::Null);
    let (code, out) = run(&["cron", "resume", "reports", "beat"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("next fire"), "{out}");
    assert_eq!(run(&["cron", "pause", "reports", "nope"]).0, Some(1));
}

#[tokio::test]
async fn schedule_with_a_priority_and_get_shows_it() {
    let (s, _client) = start().await;
    let url = s.url();
    let o = run(
        &url,
        &[
            "schedule",
            "order-close",
            "vip",
            "--in",
            "15m",
            "--priority",
            "high",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["get", "order-close", "vip"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["priority"], json!("high"), "{}", o.stdout);
    let o = run(&url, &["schedule", "order-close", "plain", "--in", "15m"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["get", "order-close", "plain"]);
    assert_eq!(o.json()["priority"], json!("normal"), "{}", o.stdout);
}

/// Issue 39 item 8: `cron add` of a schedule that can never fire (February 30th, an end in
/// the past, a year field, an overlong expression) exits 2 naming the field and writes
/// nothing; a paused schedule is listed.
#[tokio::test]
async fn cron_add_refuses_never_firing_schedules_and_list_shows_paused_ones() {
    let (s, client) = start().await;
    let url = s.url();
    let long = format!("0 0 0 * * {}1", "1,".repeat(200));
    let before = support::snapshot(&client).await;
    let cases: &[(&[&str], &str)] = &[
        (&["cron", "add", "q", "c", "--cron", "0 0 0 30 2 *"], "cron"),
        (
            &[
                "cron",
                "add",
                "q",
                "c",
                "--every",
                "1h",
                "--end",
                "2020-01-01T00:00:00Z",
            ],
            "end",
        ),
        (
            &["cron", "add", "q", "c", "--cron", "*/5 * * * * * *"],
            "cron",
        ),
        (&["cron", "add", "q", "c", "--cron", &long], "cron"),
    ];
    for (args, needle) in cases {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {} {}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(&format!("option {needle}")),
            "{args:?}: stderr {:?} lacks {needle:?}",
            o.stderr
        );
    }
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "a refusal wrote something"
    );
    assert_eq!(
        run(&url, &["cron", "add", "q", "p", "--every", "1h"]).code,
        0
    );
    assert_eq!(run(&url, &["cron", "pause", "q", "p"]).code, 0);
    let o = run(&url, &["cron", "list", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let listed = o.json();
    assert_eq!(listed[0]["id"], json!("p"), "{listed}");
    assert_eq!(listed[0]["paused"], json!(true), "{listed}");
    let o = run(&url, &["cron", "list"]);
    let row = o.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        row.contains(" p ") && row.contains("paused"),
        "{}",
        o.stdout
    );
}

/// Issue 44: `--at` with `--tz` is a local wall-clock time, resolved once with the
/// recurring schedules' rules; the output shows the resolved due time. Refusals exit 2,
/// name the field and write nothing.
#[tokio::test]
async fn schedule_at_a_local_time_prints_the_resolved_due_time() {
    let (s, client) = start().await;
    let url = s.url();
    let at = |id: &str, local: &str| {
        let args = [
            "schedule",
            "order-close",
            id,
            "--at",
            local,
            "--tz",
            "Europe/Berlin",
        ];
        run(&url, &args)
    };
    // Spring forward: 02:30 does not exist, the end of the gap (03:00 CEST = 01:00Z).
    let o = at("g", "2027-03-28T02:30");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["due_at_ms"], json!(1_806_195_600_000_i64));
    // Fall back: 02:30 happens twice, its first occurrence (00:30Z).
    let o = at("f", "2027-10-31T02:30");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["due_at_ms"], json!(1_824_942_600_000_i64));
    let o = run(&url, &["get", "order-close", "f"]);
    assert_eq!(o.json()["due_at_ms"], json!(1_824_942_600_000_i64));

    let before = support::snapshot(&client).await;
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "schedule",
                "order-close",
                "x",
                "--at",
                "2027-03-28T09:00",
                "--tz",
                "Mars/Olympus",
            ],
            "timezone",
        ),
        (
            &[
                "schedule",
                "order-close",
                "x",
                "--at",
                "2027-03-28T09:00Z",
                "--tz",
                "UTC",
            ],
            "at_local",
        ),
        (
            &[
                "schedule",
                "order-close",
                "x",
                "--at",
                "2027-02-30T09:00",
                "--tz",
                "UTC",
            ],
            "at_local",
        ),
        (
            &["schedule", "order-close", "x", "--in", "1s", "--tz", "UTC"],
            "--at",
        ),
    ];
    for (args, needle) in cases {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{args:?}: {}", o.stderr);
    }
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "a refusal wrote something"
    );
}
