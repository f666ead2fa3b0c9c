//! The load: order lifecycles (schedule, cancel, reschedule, re-schedule) through HTTP and
//! the library, dead-letter replays, the delete/create race on [`EPH`], recurring
//! schedules declared, changed and removed; and the final healing phase.

use crate::history::{Kind, Op, Res, Via, mix, now_ms};
use crate::world::{EPH, FaultClass, QUEUE, WAIT, World};
use delayq::{CancelOutcome, RescheduleOutcome, ScheduleOutcome, Selection, When};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Order drivers, and lifecycles each runs at once.
const DRIVERS: usize = 3;
const LIFECYCLES_PER_DRIVER: usize = 12;

/// Starts every driver; they stop when `stop` fires (a lifecycle under way finishes).
pub fn spawn_all(w: &Arc<World>, stop: &CancellationToken) -> Vec<JoinHandle<()>> {
    let mut out = Vec::new();
    for d in 0..DRIVERS {
        out.push(tokio::spawn(orders(w.clone(), stop.clone(), d)));
    }
    out.push(tokio::spawn(replays(w.clone(), stop.clone())));
    if w.cfg.has(FaultClass::QueueDelete) {
        out.push(tokio::spawn(delete_race(w.clone(), stop.clone())));
    }
    if w.cfg.has(FaultClass::Schedules) {
        for c in 0..2 {
            out.push(tokio::spawn(crons(w.clone(), stop.clone(), c)));
        }
    }
    out
}

/// Sleeps `ms`, or less when `stop` fires.
async fn nap(stop: &CancellationToken, ms: u64) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
    }
}

/// HTTP 1 in 3, the library otherwise split between the two serves.
fn pick_via(w: &World, rng: &mut fastrand::Rng) -> Via {
    let n = w.serve_count();
    match rng.usize(..=n) {
        i if i < n => Via::Http(i),
        _ => Via::Lib,
    }
}

/// Sends one request to serve `i` and classifies its answer. `ok` names the outcome of a
/// 2xx answer from its status and body.
async fn http(
    w: &World,
    i: usize,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    ok: impl Fn(u16, &Value) -> String,
) -> Res {
    let mut req = w.http.request(method, format!("{}{path}", w.base(i)));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    match req.send().await {
        Err(e) if e.is_connect() => Res::Refused(format!("connect: {e}")),
        Err(e) => Res::Unknown(format!("transport: {e}")),
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let code = v["error"]["code"].as_str().unwrap_or("").to_owned();
            match status {
                200..=299 => Res::Ok(ok(status, &v)),
                404 if code == "not_found" => Res::Ok("not_found".into()),
                503 if code == "redis_unavailable" || code == "redis_oom" => {
                    Res::Refused(format!("503 {code}"))
                }
                500..=599 => Res::Unknown(format!("{status} {code}")),
                _ => Res::Refused(format!("{status} {code}")),
            }
        }
    }
}

fn lib_err(e: &delayq::Error) -> Res {
    match e.write_outcome() {
        delayq::WriteOutcome::NotApplied => Res::Refused(format!("library: {e}")),
        _ => Res::Unknown(format!("library: {e}")),
    }
}

/// Runs one operation and records it.
async fn op(w: &World, via: Via, queue: &str, id: &str, kind: Kind) -> Res {
    let sent_ms = now_ms();
    let res = run_op(w, via, queue, id, &kind).await;
    w.hist.op(Op {
        queue: queue.to_owned(),
        id: id.to_owned(),
        kind,
        via,
        sent_ms,
        answered_ms: now_ms(),
        res: res.clone(),
    });
    res
}

async fn run_op(w: &World, via: Via, queue: &str, id: &str, kind: &Kind) -> Res {
    use reqwest::Method;
    let outcome = |_: u16, v: &Value| v["outcome"].as_str().unwrap_or("?").to_owned();
    let created = |s: u16, _: &Value| if s == 201 { "created" } else { "exists" }.to_owned();
    let msg = format!("/v1/queues/{queue}/messages/{id}");
    let client = &w.client;
    match (via, kind) {
        (Via::Http(i), Kind::Schedule { due }) => {
            let body = json!({"due_at": due, "payload": {"id": id, "due": due}});
            http(w, i, Method::PUT, &msg, Some(body), outcome).await
        }
        (Via::Lib, Kind::Schedule { due }) => {
            let payload = json!({"id": id, "due": due});
            match client.schedule(queue, id, When::AtMs(*due), payload).await {
                Ok(s) => Res::Ok(
                    match s.outcome {
                        ScheduleOutcome::Created => "created",
                        ScheduleOutcome::Updated => "updated",
                        ScheduleOutcome::Unchanged => "unchanged",
                        ScheduleOutcome::Duplicate => "duplicate",
                        ScheduleOutcome::CancelledByEvent => "cancelled_by_event",
                    }
                    .into(),
                ),
                Err(e) => lib_err(&e),
            }
        }
        (_, Kind::Reschedule { due }) => match client.reschedule(queue, id, When::AtMs(*due)).await
        {
            Ok(RescheduleOutcome::Rescheduled) => Res::Ok("rescheduled".into()),
            Ok(RescheduleOutcome::NotFound) => Res::Ok("not_found".into()),
            Err(e) => lib_err(&e),
        },
        (Via::Http(i), Kind::Cancel) => {
            http(w, i, Method::DELETE, &msg, None, |_, _| "cancelled".into()).await
        }
        (Via::Lib, Kind::Cancel) => match client.cancel(queue, id).await {
            Ok(CancelOutcome::Cancelled) => Res::Ok("cancelled".into()),
            Ok(CancelOutcome::NotFound) => Res::Ok("not_found".into()),
            Err(e) => lib_err(&e),
        },
        (Via::Http(i), Kind::QueueDelete) => {
            let path = format!("/v1/queues/{queue}?force=true");
            http(w, i, Method::DELETE, &path, None, |_, _| "deleted".into()).await
        }
        (Via::Lib, Kind::QueueDelete) => match client.admin().delete_queue(queue, true).await {
            Ok(_) => Res::Ok("deleted".into()),
            Err(delayq::Error::QueueNotFound { .. }) => Res::Ok("not_found".into()),
            Err(e) => lib_err(&e),
        },
        (Via::Http(i), Kind::QueueCreate) => {
            let path = format!("/v1/queues/{queue}");
            http(
                w,
                i,
                Method::PUT,
                &path,
                Some(json!({"shards": 1})),
                created,
            )
            .await
        }
        (Via::Lib, Kind::QueueCreate) => match client.admin().create_queue(queue, 1).await {
            Ok(_) => Res::Ok("created".into()),
            Err(e) => lib_err(&e),
        },
        (Via::Http(i), Kind::CronUpsert { every_s }) => {
            let path = format!("/v1/queues/{queue}/schedules/{id}");
            let body = json!({"every": format!("{every_s}s"), "payload": {"every": every_s}});
            http(w, i, Method::PUT, &path, Some(body), created).await
        }
        (Via::Http(i), Kind::CronRemove) => {
            let path = format!("/v1/queues/{queue}/schedules/{id}");
            http(w, i, Method::DELETE, &path, None, |_, _| "removed".into()).await
        }
        (Via::Http(i), Kind::Replay) => {
            let path = format!("/v1/queues/{queue}/dead/replay");
            http(
                w,
                i,
                Method::POST,
                &path,
                Some(json!({"all": true})),
                |_, _| "replayed".into(),
            )
            .await
        }
        (Via::Lib, Kind::Replay) => {
            match client
                .admin()
                .dead_replay(queue, None, &Selection::All)
                .await
            {
                Ok(n) => Res::Ok(format!("replayed {n}")),
                Err(e) => lib_err(&e),
            }
        }
        (Via::Lib, Kind::CronUpsert { .. } | Kind::CronRemove) => {
            unreachable!("schedules are driven over HTTP")
        }
    }
}

/// A due time `min..max` ms from now, distinct from every due this id was given before
/// (the checker tells an id's versions apart by their due time).
fn fresh_due(rng: &mut fastrand::Rng, used: &mut Vec<i64>, min: i64, max: i64) -> i64 {
    let mut due = now_ms() + rng.i64(min..max);
    while used.contains(&due) {
        due += 1;
    }
    used.push(due);
    due
}

/// One order's life: scheduled, then perhaps cancelled, moved (library reschedule) or
/// scheduled again (HTTP or library upsert), then perhaps cancelled.
async fn lifecycle(w: Arc<World>, stop: CancellationToken, driver: usize, n: u64) {
    let mut rng = fastrand::Rng::with_seed(mix(
        w.cfg.seed,
        &[b"order", &driver.to_le_bytes(), &n.to_le_bytes()],
    ));
    let queue = if w.cfg.has(FaultClass::QueueDelete) && rng.u8(..100) < 20 {
        EPH
    } else {
        QUEUE
    };
    let id = format!("o{driver}-{n}");
    let mut used = Vec::new();
    let due = fresh_due(&mut rng, &mut used, 100, 2500);
    let via = pick_via(&w, &mut rng);
    op(&w, via, queue, &id, Kind::Schedule { due }).await;
    let roll = rng.u8(..100);
    if roll < 30 {
        nap(&stop, rng.u64(0..1500)).await;
        let via = pick_via(&w, &mut rng);
        op(&w, via, queue, &id, Kind::Cancel).await;
    } else if roll < 60 {
        nap(&stop, rng.u64(0..1500)).await;
        let due = fresh_due(&mut rng, &mut used, 100, 2500);
        let kind = if rng.bool() {
            Kind::Reschedule { due }
        } else {
            Kind::Schedule { due }
        };
        let via = pick_via(&w, &mut rng);
        op(&w, via, queue, &id, kind).await;
        if rng.u8(..100) < 30 {
            nap(&stop, rng.u64(0..1500)).await;
            let via = pick_via(&w, &mut rng);
            op(&w, via, queue, &id, Kind::Cancel).await;
        }
    }
}

/// A driver: up to [`LIFECYCLES_PER_DRIVER`] lifecycles at once, a new one every 10-80 ms.
async fn orders(w: Arc<World>, stop: CancellationToken, driver: usize) {
    let mut rng = fastrand::Rng::with_seed(mix(w.cfg.seed, &[b"driver", &driver.to_le_bytes()]));
    let mut running = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        while running.len() >= LIFECYCLES_PER_DRIVER {
            if let Some(Err(e)) = running.join_next().await {
                panic!("a lifecycle failed: {e}");
            }
        }
        running.spawn(lifecycle(w.clone(), stop.clone(), driver, n));
        n += 1;
        nap(&stop, rng.u64(10..80)).await;
    }
    while let Some(r) = running.join_next().await {
        if let Err(e) = r {
            panic!("a lifecycle failed: {e}");
        }
    }
}

/// Replays every dead letter of both queues every 1-3 s, over HTTP or the library.
async fn replays(w: Arc<World>, stop: CancellationToken) {
    let mut rng = fastrand::Rng::with_seed(mix(w.cfg.seed, &[b"replays"]));
    while !stop.is_cancelled() {
        nap(&stop, rng.u64(1000..3000)).await;
        for q in [QUEUE, EPH] {
            let via = pick_via(&w, &mut rng);
            op(&w, via, q, "", Kind::Replay).await;
        }
    }
}

/// Force-deletes [`EPH`] every 1.5-4 s and registers it again 0-0.8 s later, over HTTP or
/// the library, while lifecycles schedule into it.
async fn delete_race(w: Arc<World>, stop: CancellationToken) {
    let mut rng = fastrand::Rng::with_seed(mix(w.cfg.seed, &[b"delete"]));
    while !stop.is_cancelled() {
        nap(&stop, rng.u64(1500..4000)).await;
        let via = pick_via(&w, &mut rng);
        op(&w, via, EPH, "", Kind::QueueDelete).await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..800))).await;
        let via = pick_via(&w, &mut rng);
        op(&w, via, EPH, "", Kind::QueueCreate).await;
    }
}

/// Recurring schedule `c<n>` on [`QUEUE`]: declared every 1 or 2 s, re-declared with the
/// other interval, removed, again.
async fn crons(w: Arc<World>, stop: CancellationToken, c: usize) {
    let mut rng = fastrand::Rng::with_seed(mix(w.cfg.seed, &[b"cron", &c.to_le_bytes()]));
    let id = format!("c{c}");
    let n = w.serve_count();
    while !stop.is_cancelled() {
        let every_s = rng.u32(1..=2);
        op(
            &w,
            Via::Http(rng.usize(..n)),
            QUEUE,
            &id,
            Kind::CronUpsert { every_s },
        )
        .await;
        nap(&stop, rng.u64(1000..4000)).await;
        if rng.bool() {
            let every_s = 3 - every_s;
            op(
                &w,
                Via::Http(rng.usize(..n)),
                QUEUE,
                &id,
                Kind::CronUpsert { every_s },
            )
            .await;
            nap(&stop, rng.u64(1000..3000)).await;
        }
        op(&w, Via::Http(rng.usize(..n)), QUEUE, &id, Kind::CronRemove).await;
        nap(&stop, rng.u64(500..2000)).await;
    }
    // Leave none behind: removed until a removal is answered.
    for _ in 0..20 {
        let res = op(&w, Via::Http(rng.usize(..n)), QUEUE, &id, Kind::CronRemove).await;
        if res.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the healing phase saw.
pub struct Healed {
    /// Rounds of dead-letter replay it took.
    pub rounds: u32,
    /// Whether the queues drained (nothing scheduled, pending or dead) within [`WAIT`].
    pub drained: bool,
}

/// With every process up and the receiver answering OK: [`EPH`] registered again, dead
/// letters replayed until both queues have nothing scheduled, pending or dead.
pub async fn heal(w: &Arc<World>) -> Healed {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut rounds = 0;
    op(w, Via::Lib, EPH, "", Kind::QueueCreate).await;
    loop {
        rounds += 1;
        for q in [QUEUE, EPH] {
            op(w, Via::Lib, q, "", Kind::Replay).await;
        }
        let mut quiet = true;
        for q in [QUEUE, EPH] {
            match w.client.admin().stats(q).await {
                Ok(s) => {
                    quiet &= s.scheduled == 0
                        && s.dead == 0
                        && s.groups
                            .iter()
                            .all(|g| g.pending == 0 && g.lag.unwrap_or(0) == 0);
                }
                Err(_) => quiet = false,
            }
        }
        // And the history itself: every version that must be delivered was, to every
        // group (stats alone can say "nothing unread" when a group's lag is unknown).
        quiet = quiet && {
            let ops = w.hist.ops.lock().unwrap().clone();
            let dels = w.hist.deliveries.lock().unwrap().clone();
            let faults = w.hist.faults.lock().unwrap().clone();
            crate::check::judge(&ops, &dels, &faults, true)
                .violations
                .iter()
                .all(|v| !matches!(crate::class_of(v), "lost" | "partial"))
        };
        if quiet {
            return Healed {
                rounds,
                drained: true,
            };
        }
        if tokio::time::Instant::now() > deadline {
            return Healed {
                rounds,
                drained: false,
            };
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}
