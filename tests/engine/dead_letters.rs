//! Dead letters stay bounded: retention and a per-queue cap, pages ordered oldest first
//! across shards (replay and purge of everything in bounded memory: tests/memory.rs);
//! abandoned groups can be deleted so trimming resumes.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{ClientOptions, Error, Housekeeper, HousekeepingOptions, Worker, WorkerOptions};
use std::time::Duration;
use support::{raw, start_with, wait_for, xadd_dead};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";

#[tokio::test]
async fn pages_are_oldest_first_across_shards() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let mut pipe = redis::pipe();
    let mut expected = Vec::new();
    // 40 dead letters with interleaved ids over the 4 shards (same ms on several shards).
    for i in 0..40u16 {
        let shard = (i * 7) % 4;
        let id = format!("{}-{}", 1_700_000_000_000u64 + u64::from(i / 3), i % 3);
        xadd_dead(&mut pipe, shard, &id, &format!("o{i}"), "1:{}");
        expected.push((id, shard, format!("o{i}")));
    }
    let _: () = pipe.query_async(&mut client.connection()).await.unwrap();
    expected.sort_by(|a, b| {
        let key = |(id, shard, _): &(String, u16, String)| {
            let (ms, seq) = id.split_once('-').unwrap();
            (
                ms.parse::<u64>().unwrap(),
                seq.parse::<u64>().unwrap(),
                *shard,
            )
        };
        key(a).cmp(&key(b))
    });
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = client
            .admin()
            .dead_page(Q, None, after.as_deref(), 7)
            .await
            .unwrap();
        assert!(page.dead_letters.len() <= 7);
        seen.extend(page.dead_letters.iter().map(|d| d.id.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<String> = expected.into_iter().map(|(_, _, o)| o).collect();
    assert_eq!(seen, want, "oldest first across shards, each once");
}

#[tokio::test]
async fn retention_and_the_cap_bound_dead_letters() {
    let (_s, client) = start_with(ClientOptions::default().shards(2)).await;
    let now = client.now_ms();
    let mut pipe = redis::pipe();
    // 10 older than the retention, 30 recent, over two shards.
    for i in 0..10 {
        xadd_dead(
            &mut pipe,
            i % 2,
            &format!("{}-{i}", now - 20 * 24 * 3_600_000),
            &format!("old{i}"),
            "1:{}",
        );
    }
    for i in 0..30 {
        xadd_dead(
            &mut pipe,
            i % 2,
            &format!("{}-{i}", now - 1000),
            &format!("new{i}"),
            "1:{}",
        );
    }
    let _: () = pipe.query_async(&mut client.connection()).await.unwrap();
    assert_eq!(client.admin().stats(Q).await.unwrap().dead, 40);
    let hk = Housekeeper::new(
        &client,
        &[Q],
        HousekeepingOptions::default()
            .dead_retention(Duration::from_secs(14 * 24 * 3600))
            .dead_max_per_queue(20),
    )
    .unwrap();
    let r = hk.trim_dead().await.unwrap();
    assert_eq!(r.count, 20, "10 past retention, then 10 over the cap");
    let left = client.admin().dead_list(Q, None, 100).await.unwrap();
    assert_eq!(left.len(), 20);
    assert!(
        left.iter().all(|d| d.id.starts_with("new")),
        "the oldest went first"
    );
    // Bad settings are refused.
    assert!(
        Housekeeper::new(
            &client,
            &[Q],
            HousekeepingOptions::default().dead_max_per_queue(0)
        )
        .is_err()
    );
}

#[tokio::test]
async fn an_abandoned_group_can_be_deleted_and_trimming_resumes() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    let stream = "{dq:order-close:0}:stream";
    // Two groups; "old" has a consumer that read once and then went away with entries.
    for g in ["close", "old"] {
        let _: () = raw(&client, &["XGROUP", "CREATE", stream, g, "0", "MKSTREAM"]).await;
    }
    for i in 0..10 {
        client
            .schedule(
                Q,
                &format!("o{i}"),
                delayq::When::in_ms(0),
                serde_json::json!(i),
            )
            .await
            .unwrap();
    }
    delayq::Dispatcher::new(&client, Q, delayq::DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let _: redis::Value = raw(
        &client,
        &[
            "XREADGROUP",
            "GROUP",
            "old",
            "gone",
            "COUNT",
            "3",
            "STREAMS",
            stream,
            ">",
        ],
    )
    .await;
    let rec = support::Recorder::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    rec.wait_len(10, Duration::from_secs(30)).await;
    let groups = client.admin().stats(Q).await.unwrap().groups;
    let old = groups.iter().find(|g| g.group == "old").unwrap();
    assert_eq!(old.pending, 3);
    assert!(old.idle_ms.is_some());
    // The live group is refused without force; the unknown one is not found.
    let e = client
        .admin()
        .delete_group(Q, "close", false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::GroupBusy { .. }), "{e}");
    let e = client
        .admin()
        .delete_group(Q, "nope", false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e}");
    // "old" read just now too (within the minute): force it, as an operator would.
    assert_eq!(
        client.admin().delete_group(Q, "old", true).await.unwrap(),
        3
    );
    let hk = std::sync::Arc::new(
        Housekeeper::new(&client, &[Q], HousekeepingOptions::default()).unwrap(),
    );
    let c2 = client.clone();
    wait_for(
        "the stream trimmed once the old group is gone",
        Duration::from_secs(30),
        move || {
            let (hk, c) = (hk.clone(), c2.clone());
            async move {
                hk.trim().await.unwrap();
                c.admin().stats(Q).await.unwrap().stream_length <= 1
            }
        },
    )
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    assert!(
        client
            .admin()
            .stats(Q)
            .await
            .unwrap()
            .groups
            .iter()
            .all(|g| g.group != "old")
    );
}

/// A group whose worker runs but has had nothing to do is alive: Redis 7.0 creates no
/// consumer on a read that finds nothing, so the worker's heartbeat says it. Deleting the
/// group without force is refused until the worker stops.
#[tokio::test]
async fn a_quiet_group_with_a_running_worker_counts_as_alive() {
    let (_s, client) = support::start().await;
    let w = Worker::new(
        &client,
        Q,
        "quiet",
        |_d: delayq::Delivery| async { Ok(()) },
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let c = client.clone();
    wait_for(
        "the worker's heartbeat",
        Duration::from_secs(30),
        move || {
            let c = c.clone();
            async move {
                c.admin()
                    .stats(Q)
                    .await
                    .unwrap()
                    .groups
                    .iter()
                    .any(|g| g.group == "quiet" && g.consumers == 1)
            }
        },
    )
    .await;
    let g = client.admin().stats(Q).await.unwrap().groups;
    let quiet = g.iter().find(|g| g.group == "quiet").unwrap();
    assert!(quiet.idle_ms.is_some_and(|i| i < 60_000), "{quiet:?}");
    let e = client
        .admin()
        .delete_group(Q, "quiet", false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::GroupBusy { .. }), "{e}");
    cancel.cancel();
    h.await.unwrap().unwrap();
    let g = client.admin().stats(Q).await.unwrap().groups;
    let quiet = g.iter().find(|g| g.group == "quiet").unwrap();
    assert_eq!(quiet.consumers, 0, "{quiet:?}");
    assert_eq!(
        client
            .admin()
            .delete_group(Q, "quiet", false)
            .await
            .unwrap(),
        0
    );
}

/// Dead letters carry the payload byte for byte, like every other surface: big integers,
/// long decimals, duplicate keys and lone surrogates survive listing.
#[tokio::test]
async fn dead_letters_keep_the_payload_byte_for_byte() {
    let (_s, client) = start_with(delayq::ClientOptions::default()).await;
    let text = r#"{"big":123456789012345678901234567890,"f":0.10000000000000000000001,"e":1e400,"s":"\ud800","a":1,"a":2}"#;
    let mut pipe = redis::pipe();
    xadd_dead(&mut pipe, 0, "1-0", "exact", &format!("1:{text}"));
    let () = pipe.query_async(&mut client.connection()).await.unwrap();
    let page = client.admin().dead_page(Q, None, None, 10).await.unwrap();
    assert_eq!(page.dead_letters.len(), 1);
    assert_eq!(page.dead_letters[0].payload.as_str(), text);
    let listed = serde_json::to_string(&page).unwrap();
    assert!(listed.contains(text), "{listed}");
}

/// `max_per_queue` is a cap on the queue, split exactly between its shards: 25 on 4 shards
/// keeps 25 (the per-shard rounding used to keep 28).
#[tokio::test]
async fn the_dead_letter_cap_is_exact_over_shards() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let now = client.now_ms();
    let mut pipe = redis::pipe();
    for shard in 0..4u16 {
        for i in 0..10 {
            xadd_dead(
                &mut pipe,
                shard,
                &format!("{now}-{i}"),
                &format!("s{shard}-{i}"),
                "1:{}",
            );
        }
    }
    let () = pipe.query_async(&mut client.connection()).await.unwrap();
    let hk = Housekeeper::new(
        &client,
        &[Q],
        HousekeepingOptions::default().dead_max_per_queue(25),
    )
    .unwrap();
    assert_eq!(hk.trim_dead().await.unwrap().count, 15);
    let mut kept = 0;
    for shard in 0..4 {
        let n: i64 = raw(
            &client,
            &["XLEN", &format!("{{dq:order-close:{shard}}}:dead")],
        )
        .await;
        kept += n;
    }
    assert_eq!(kept, 25);
}
