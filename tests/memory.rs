//! Tests that measure this process's own memory, each alone in a process of its own (a test
//! binary of its own, one test at a time), so no other test's allocations count.
#![allow(clippy::unwrap_used)]

mod support;

use delayq::{ClientOptions, Selection};
use support::{start_with, xadd_dead};

const Q: &str = "order-close";

fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn current_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_200k_dead_letters_takes_bounded_memory() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    let payload = format!("1:{{\"note\":\"{}\"}}", "x".repeat(300));
    let n = 200_000u64;
    for chunk in 0..(n / 10_000) {
        let mut pipe = redis::pipe();
        for i in 0..10_000 {
            let k = chunk * 10_000 + i;
            xadd_dead(
                &mut pipe,
                0,
                &format!("{}-0", 1_700_000_000_000u64 + k),
                &format!("o{k}"),
                &payload,
            );
        }
        let _: () = pipe.query_async(&mut client.connection()).await.unwrap();
    }
    assert_eq!(client.admin().stats(Q).await.unwrap().dead, n);
    // Reset the peak RSS (Linux: writing 5 to clear_refs), then replay everything.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let base = current_rss_kib();
    let replayed = client
        .admin()
        .dead_replay(Q, None, &Selection::All)
        .await
        .unwrap();
    assert_eq!(replayed, n);
    let grown_mib = peak_rss_kib().saturating_sub(base) / 1024;
    assert!(grown_mib < 64, "replay grew the process by {grown_mib} MiB");
    let s = client.admin().stats(Q).await.unwrap();
    assert_eq!((s.dead, s.stream_length), (0, n));
    // Purge of everything pages the same way.
    let mut pipe = redis::pipe();
    for k in 0..1000u64 {
        xadd_dead(
            &mut pipe,
            0,
            &format!("{}-0", 1_800_000_000_000u64 + k),
            "p",
            "1:{}",
        );
    }
    let _: () = pipe.query_async(&mut client.connection()).await.unwrap();
    assert_eq!(
        client
            .admin()
            .dead_purge(Q, None, &Selection::All)
            .await
            .unwrap(),
        1000
    );
}
