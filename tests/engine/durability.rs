//! Durable enqueue against a real master and replica: a replicated schedule is acknowledged
//! only once the replica has it; without a replica it fails clearly (and may still fire).
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{Client, ClientOptions, Durability, Error, LocalRedis, Mode, NewOrder, When};
use serde_json::json;
use std::time::Duration;
use support::wait_for;

/// A replica of `master` and a client on it, once the replica is in sync.
async fn synced_replica(master: &LocalRedis) -> (LocalRedis, Client) {
    let port = master.port().to_string();
    let replica = LocalRedis::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let client = Client::connect(&replica.url()).await.unwrap();
    wait_for("the replica to sync", Duration::from_secs(60), || {
        let c = client.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c.connection())
                .await
                .unwrap();
            info.contains("master_link_status:up")
        }
    })
    .await;
    (replica, client)
}

#[tokio::test]
async fn replicated_schedules_wait_for_a_replica() {
    let master = LocalRedis::start().unwrap();
    let (mut replica, replica_client) = synced_replica(&master).await;

    // A generous WAIT for the writes that must succeed (a loaded machine may take a while
    // to replicate 500 orders); a short one below, where no replica can answer.
    let durable = Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_secs(30),
    };
    let client = Client::connect_with(&master.url(), ClientOptions::default().durability(durable))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    let orders: Vec<NewOrder> = (0..500)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(60_000), json!(i)))
        .collect();
    client
        .schedule_many("q", &orders, Mode::Upsert)
        .await
        .unwrap();
    // Acknowledged means the replica has it, now.
    let on_replica: i64 = redis::cmd("ZCARD")
        .arg("{dq:q:0}:due")
        .query_async(&mut replica_client.connection())
        .await
        .unwrap();
    assert_eq!(on_replica, 500);

    // No replica: a clear error, and the order is on the leader (it may still fire).
    replica.kill();
    let short = client.with_durability(Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(300),
    });
    let e = short
        .schedule("q", "late", When::in_ms(60_000), json!(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("may still fire"));
    assert!(client.get("q", "late").await.unwrap().is_some());
    // The default durability does not wait.
    let fast = client.with_durability(Durability::Leader);
    fast.schedule("q", "fast", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
}

/// The connection of a durable schedule is killed after its write, while `WAIT` is still
/// waiting (the replica hangs): the call reports `NotReplicated`, never success and never a
/// bare connection error, and the order is on the leader.
#[tokio::test]
async fn a_durable_write_whose_connection_dies_before_wait_answers_is_not_replicated() {
    let master = LocalRedis::start().unwrap();
    let port = master.port().to_string();
    let replica = LocalRedis::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let admin = Client::connect(&master.url()).await.unwrap();
    wait_for("the replica to sync", Duration::from_secs(60), || {
        let c = admin.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c.connection())
                .await
                .unwrap();
            info.contains("connected_slaves:1") && info.contains("state=online")
        }
    })
    .await;
    support::declare_queues(&admin).await;
    // The replica hangs: WAIT blocks until its (long) timeout.
    replica.suspend().unwrap();
    let durable = Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_secs(50),
    };
    let client = Client::connect_with(&master.url(), ClientOptions::default().durability(durable))
        .await
        .unwrap();
    let call = tokio::spawn(async move {
        client
            .schedule("q", "o-killed", When::in_ms(60_000), json!({"n": 1}))
            .await
    });
    // The write is done and WAIT is blocked on the durable connection: kill that connection.
    let blocked_id = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    wait_for("WAIT to block", Duration::from_secs(20), || {
        let (c, found) = (admin.clone(), blocked_id.clone());
        async move {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut c.connection())
                .await
                .unwrap();
            let id = list
                .lines()
                .find(|l| l.contains("cmd=wait"))
                .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
                .map(str::to_owned);
            let ok = id.is_some();
            *found.lock().unwrap() = id;
            ok
        }
    })
    .await;
    let blocked_id = blocked_id.lock().unwrap().clone();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(blocked_id.unwrap())
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let r = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call returns once its connection is gone")
        .unwrap();
    let e = r.expect_err("a write whose WAIT never answered is not acknowledged");
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "expected NotReplicated, got {e}"
    );
    assert!(admin.get("q", "o-killed").await.unwrap().is_some());
    replica.resume().unwrap();
}

/// The read-only scripts (`get.lua`, `history.lua`, `stats.lua`, flagged `no-writes`) answer
/// from a read-only replica: an operator may point lookups and statistics at a replica.
#[tokio::test]
async fn lookups_and_statistics_run_on_a_read_only_replica() {
    let master = LocalRedis::start().unwrap();
    let (_replica, on_replica) = synced_replica(&master).await;
    let durable = Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_secs(5),
    };
    let client = Client::connect_with(&master.url(), ClientOptions::default().durability(durable))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    client
        .schedule("q", "o1", When::in_ms(600_000), json!({"n": 1}))
        .await
        .unwrap();

    let got = on_replica.get("q", "o1").await.unwrap().unwrap();
    assert_eq!(got.payload, json!({"n": 1}));
    let stats = on_replica.admin().stats("q").await.unwrap();
    assert_eq!(stats.scheduled, 1);
    let history = on_replica
        .admin()
        .history("q", "o1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history.id, "o1");
    // The replica is read-only indeed: a write through it is refused.
    let e = on_replica
        .schedule("q", "o2", When::in_ms(600_000), json!(2))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("read only replica"), "{e}");
}

/// How many commands the server at `client` refused with `NOREPLICAS` so far.
async fn noreplicas_refusals(client: &Client) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(&mut client.connection())
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.trim().strip_prefix("errorstat_NOREPLICAS:count="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A master that refuses writes for want of replicas (`min-replicas-to-write`, as the old
/// and the new master do during a failover): a schedule fails as transient and not written;
/// the dispatcher and the worker (reads, acknowledgements, a retry) keep running through the
/// refusals and deliver everything once writes are taken again.
#[tokio::test]
async fn loops_ride_through_a_master_refusing_writes_for_want_of_replicas() {
    use delayq::{
        Backoff, Delivery, Dispatcher, DispatcherOptions, HandlerError, Worker, WorkerOptions,
    };
    use std::sync::{Arc, Mutex};
    use tokio_util::sync::CancellationToken;

    let master = LocalRedis::start().unwrap();
    let client = Client::connect(&master.url()).await.unwrap();
    support::declare_queues(&client).await;
    let admin = Client::connect(&master.url()).await.unwrap();
    // Every delivery (id, attempt); the first attempt of each order asks for a retry.
    let seen: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let s = seen.clone();
    let handler = move |d: Delivery| {
        s.lock().unwrap().push((d.id.clone(), d.attempt));
        std::future::ready(if d.attempt == 1 {
            Err(HandlerError::retry("first attempt"))
        } else {
            Ok(())
        })
    };
    let worker = Worker::new(
        &client,
        "q",
        "g",
        handler,
        WorkerOptions::default()
            .block(Duration::from_millis(100))
            .reclaim_every(Duration::from_millis(50))
            .backoff(Backoff::Fixed(Duration::from_millis(300))),
    )
    .unwrap();
    worker.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let w = {
        let c = cancel.clone();
        tokio::spawn(async move { worker.run(c).await })
    };
    let dispatcher = Dispatcher::new(&client, "q", DispatcherOptions::default()).unwrap();
    let d = {
        let c = cancel.clone();
        tokio::spawn(async move { dispatcher.run(c).await })
    };

    // "a" is delivered once (attempt 1 asks for a retry), "b" comes due during the refusal.
    client
        .schedule("q", "a", When::in_ms(0), json!(1))
        .await
        .unwrap();
    client
        .schedule("q", "b", When::in_ms(1500), json!(2))
        .await
        .unwrap();
    let s = seen.clone();
    wait_for(
        "the first attempt of a",
        Duration::from_secs(30),
        move || {
            let n = s.lock().unwrap().len();
            async move { n >= 1 }
        },
    )
    .await;
    let before = noreplicas_refusals(&admin).await;
    let _: String = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg("1")
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    let e = client
        .schedule("q", "refused", When::in_ms(0), json!(3))
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_eq!(e.write_outcome(), delayq::WriteOutcome::NotApplied, "{e}");
    // The loops' own writes (dispatching "b" once due, reading, the retry of "a") are
    // refused for a while, and nothing stops.
    let t0 = tokio::time::Instant::now();
    let a = admin.clone();
    wait_for(
        "the loops refused several times, past b's due time",
        Duration::from_secs(30),
        move || {
            let a = a.clone();
            async move {
                noreplicas_refusals(&a).await >= before + 10
                    && t0.elapsed() > Duration::from_millis(1600)
            }
        },
    )
    .await;
    assert!(!w.is_finished() && !d.is_finished(), "a loop stopped");
    let _: String = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg("0")
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    let s = seen.clone();
    wait_for(
        "a and b delivered at attempt 2",
        Duration::from_secs(60),
        move || {
            let got = s.lock().unwrap().clone();
            let done = ["a", "b"]
                .iter()
                .all(|id| got.iter().any(|(i, n)| i == id && *n == 2));
            async move { done }
        },
    )
    .await;
    assert_eq!(client.get("q", "refused").await.unwrap().map(|_| ()), None);
    cancel.cancel();
    w.await.unwrap().unwrap();
    d.await.unwrap();
}

/// `Durability::replicated()` waits for every replica the master has, and covers cancels
/// and reschedules too: with two replicas and one of them hung, a write one replica
/// confirms is `NotReplicated { acked: 1, wanted: 2 }` (where a `WAIT` for one replica
/// acknowledges it), and once both confirm, both hold it.
#[tokio::test]
async fn every_replica_durability_waits_for_each_replica_and_covers_cancels_and_reschedules() {
    let master = LocalRedis::start().unwrap();
    let (first, first_client) = synced_replica(&master).await;
    let (second, second_client) = synced_replica(&master).await;
    // The master counts both replicas in sync (what the durable writes learn their count
    // from) before the first write: a replica's own link can be up a moment before.
    let probe = Client::connect(&master.url()).await.unwrap();
    wait_for(
        "the master to count two replicas online",
        Duration::from_secs(60),
        || {
            let c = probe.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c.connection())
                    .await
                    .unwrap();
                info.matches("state=online").count() == 2
            }
        },
    )
    .await;
    // A generous WAIT where both replicas must confirm (a loaded machine may be slow); a
    // short one below, where one of them cannot.
    let every = match Durability::replicated() {
        Durability::EveryReplica { .. } => Durability::EveryReplica {
            timeout: Duration::from_secs(30),
        },
        other => panic!("replicated() is {other:?}"),
    };
    let short = Durability::EveryReplica {
        timeout: Duration::from_millis(300),
    };
    let client = Client::connect_with(&master.url(), ClientOptions::default().durability(every))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    let score = |c: &Client, id: &'static str| {
        let mut conn = c.connection();
        async move {
            let s: Option<f64> = redis::cmd("ZSCORE")
                .arg("{dq:q:0}:due")
                .arg(id)
                .query_async(&mut conn)
                .await
                .unwrap();
            s
        }
    };

    // Acknowledged means both replicas have it, now: the schedule, then its reschedule and
    // its cancel.
    client
        .schedule("q", "a", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    client
        .schedule("q", "b", When::in_ms(60_000), json!(2))
        .await
        .unwrap();
    assert!(score(&first_client, "a").await.is_some());
    assert!(score(&second_client, "a").await.is_some());
    let before = score(&second_client, "a").await.unwrap();
    client
        .reschedule("q", "a", When::in_ms(7_200_000))
        .await
        .unwrap();
    let after = score(&second_client, "a").await.unwrap();
    assert!(after > before + 3_600_000.0, "{before} -> {after}");
    assert_eq!(score(&client, "a").await, Some(after));
    client.cancel("q", "a").await.unwrap();
    assert_eq!(score(&first_client, "a").await, None);
    assert_eq!(score(&second_client, "a").await, None);

    // One of the two hangs: every kind of write is refused as not replicated (it may be on
    // the leader), where a WAIT for one replica acknowledges.
    second.suspend().unwrap();
    let slow = client.with_durability(short);
    let not_replicated = |r: Result<(), Error>| match r {
        Err(Error::NotReplicated {
            acked: 1,
            wanted: 2,
            ..
        }) => {}
        other => panic!("expected NotReplicated 1 of 2, got {other:?}"),
    };
    not_replicated(
        slow.schedule("q", "c", When::in_ms(60_000), json!(3))
            .await
            .map(drop),
    );
    not_replicated(
        slow.reschedule("q", "b", When::in_ms(120_000))
            .await
            .map(drop),
    );
    not_replicated(slow.cancel("q", "b").await.map(drop));
    let one = client.with_durability(Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_secs(30),
    });
    one.schedule("q", "d", When::in_ms(60_000), json!(4))
        .await
        .unwrap();

    // Back: writes are acknowledged again, by both.
    second.resume().unwrap();
    client
        .schedule("q", "e", When::in_ms(60_000), json!(5))
        .await
        .unwrap();
    assert!(score(&second_client, "e").await.is_some());
    drop(first);
}

/// Issue 39 item 11 (admin writes): with `durability = "replicated"`, a queue create, a
/// schedule create and removal and a queue delete answer once the replica has them; with
/// the replica hung, each is `NotReplicated` (applied on the master, may be lost with it)
/// instead of an acknowledgement a failover could undo.
#[tokio::test]
async fn admin_writes_wait_for_the_replicas_under_replicated_durability() {
    let master = LocalRedis::start().unwrap();
    let (replica, replica_client) = synced_replica(&master).await;
    let probe = Client::connect(&master.url()).await.unwrap();
    wait_for(
        "the master to count its replica online",
        Duration::from_secs(60),
        || {
            let c = probe.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c.connection())
                    .await
                    .unwrap();
                info.contains("state=online")
            }
        },
    )
    .await;
    let every = Durability::EveryReplica {
        timeout: Duration::from_secs(30),
    };
    let client = Client::connect_with(&master.url(), ClientOptions::default().durability(every))
        .await
        .unwrap();
    let record = |c: &Client, q: &'static str| {
        let key = c
            .keyspace()
            .queue_record(&delayq::engine::keys::QueueName::new(q).unwrap());
        let mut conn = c.connection();
        async move {
            let n: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 1
        }
    };
    client.admin().create_queue("qa", 1).await.unwrap();
    assert!(record(&replica_client, "qa").await);
    let schedules = delayq::Schedules::new(&client);
    schedules
        .upsert(&delayq::ScheduleSpec::every("qa", "tick", "1h", json!({})))
        .await
        .unwrap();

    // The replica hangs: every admin write is refused as not replicated.
    replica.suspend().unwrap();
    let slow = client.with_durability(Durability::EveryReplica {
        timeout: Duration::from_millis(300),
    });
    let not_replicated = |what: &str, r: Result<(), Error>| match r {
        Err(Error::NotReplicated { acked: 0, .. }) => {}
        other => panic!("{what}: expected NotReplicated, got {other:?}"),
    };
    not_replicated("create", slow.admin().create_queue("qb", 1).await.map(drop));
    let slow_schedules = delayq::Schedules::new(&slow);
    not_replicated(
        "schedule upsert",
        slow_schedules
            .upsert(&delayq::ScheduleSpec::every("qa", "other", "1h", json!({})))
            .await
            .map(drop),
    );
    not_replicated(
        "schedule remove",
        slow_schedules.remove("qa", "tick").await.map(drop),
    );
    not_replicated(
        "pause",
        slow.admin().set_paused("qa", None, true).await.map(drop),
    );
    not_replicated(
        "dedup window",
        slow.admin()
            .set_dedup_window("qa", Duration::from_secs(60))
            .await,
    );
    not_replicated(
        "dead-letter purge",
        slow.admin()
            .dead_purge("qa", None, &delayq::Selection::All)
            .await
            .map(drop),
    );
    not_replicated(
        "delete",
        slow.admin().delete_queue("qa", true).await.map(drop),
    );
    replica.resume().unwrap();
    // Once it follows again, the same writes are acknowledged.
    client.admin().create_queue("qc", 1).await.unwrap();
    assert!(record(&replica_client, "qc").await);
}

/// Issue 39 item 11 (`/readyz`): with `durability = "replicated"`, `/readyz` is 200 while
/// durable writes are acknowledged and 503 `not_replicated` while the replica they wait for
/// does not follow (the master still takes writes, so a write probe alone says 200).
#[tokio::test]
async fn readyz_is_not_ready_while_durable_writes_would_be_refused() {
    use tower::ServiceExt;
    let master = LocalRedis::start().unwrap();
    let (replica, _replica_client) = synced_replica(&master).await;
    let probe = Client::connect(&master.url()).await.unwrap();
    wait_for(
        "the master to count its replica online",
        Duration::from_secs(60),
        || {
            let c = probe.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c.connection())
                    .await
                    .unwrap();
                info.contains("state=online")
            }
        },
    )
    .await;
    let client = Client::connect_with(
        &master.url(),
        ClientOptions::default().durability(Durability::EveryReplica {
            timeout: Duration::from_millis(300),
        }),
    )
    .await
    .unwrap();
    let router = delayq::service::http::app(delayq::service::http::AppState::new(client, vec![]));
    let readyz = || async {
        let req = axum::http::Request::builder()
            .uri("/readyz")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(readyz().await.0, 200);
    replica.suspend().unwrap();
    let (status, body) = readyz().await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not_replicated"), "{body}");
    replica.resume().unwrap();
    wait_for("ready again", Duration::from_secs(30), || async {
        readyz().await.0 == 200
    })
    .await;
}
