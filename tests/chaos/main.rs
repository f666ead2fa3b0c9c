//! The standing fault campaign (docs/fault-campaign.md): a seeded, reproducible run that
//! drives schedules, cancels, reschedules, dead-letter replays, recurring-schedule updates
//! and queue delete/create races through the library and two real `delayq serve`
//! processes while it kills and restarts them, kills Redis (AOF on, restarted on the same
//! port and directory), freezes Redis (SIGSTOP/SIGCONT) and makes the webhook receiver and
//! the library handler fail or time out by the seeded RNG (and, with the opt-in class
//! `sentinel`, runs on a Sentinel-managed master and two replicas that it fails over and
//! whose master it kills). It records every operation with
//! the time its answer arrived and every delivery as its receiver saw it, then checks the
//! history (check.rs): nothing acknowledged lost, nothing cancelled or deleted delivered,
//! nothing delivered before its due time, duplicates bounded by the work killed processes
//! held, and the order history and stats agreeing with the deliveries.
//!
//! `cargo test --test chaos` runs a short campaign on a fixed seed and one on a random seed
//! (printed). `DELAYQ_CHAOS_SEED=N` runs that seed only; `DELAYQ_CHAOS_DURATION=2m` sets how
//! long each campaign injects faults; `DELAYQ_CHAOS_FAULTS=serve-kill,redis-stop,...`
//! picks the fault classes (see [`world::FaultClass`]).
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../support/mod.rs"]
mod support;

mod check;
mod drive;
mod history;
mod world;

use std::time::Duration;

/// The seed CI runs every time.
const FIXED_SEED: u64 = 0x5EED_0039;
/// How long each CI campaign injects faults (then heals and checks).
const CI_DURATION: Duration = Duration::from_secs(25);
/// Violation classes of known engine defects, reported (with every instance) but not
/// failing the test until their fix is merged (docs/fault-campaign.md, "Known defects");
/// `DELAYQ_CHAOS_STRICT=1` fails on them too.
const KNOWN_DEFECTS: &[&str] = &[];

/// Writes `line` to stderr past the test harness's capture: the seeds and the figures of
/// every campaign show in CI's log, passing or not.
fn shown(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The class of a violation: its leading `[class]`.
pub(crate) fn class_of(v: &str) -> &str {
    v.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .map_or("", |(c, _)| c)
}

#[test]
fn fault_campaign() {
    let duration = std::env::var("DELAYQ_CHAOS_DURATION")
        .ok()
        .map(|d| world::parse_duration(&d).expect("DELAYQ_CHAOS_DURATION: e.g. 90s, 2m, 1h"))
        .unwrap_or(CI_DURATION);
    let faults = match std::env::var("DELAYQ_CHAOS_FAULTS") {
        Ok(list) => world::FaultClass::parse_list(&list).expect("DELAYQ_CHAOS_FAULTS"),
        Err(_) => world::FaultClass::ci_default(),
    };
    let seeds: Vec<u64> = match std::env::var("DELAYQ_CHAOS_SEED") {
        Ok(s) => vec![s.trim().parse().expect("DELAYQ_CHAOS_SEED: an integer")],
        Err(_) => vec![FIXED_SEED, fastrand::u64(..)],
    };
    for seed in seeds {
        let cfg = world::Campaign {
            seed,
            duration,
            faults: faults.clone(),
        };
        shown(&format!(
            "fault campaign: seed {seed}; reproduce with: {}",
            cfg.reproduce()
        ));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let report = rt.block_on(world::run(cfg.clone()));
        rt.shutdown_timeout(Duration::from_secs(5));
        shown(&report.summary);
        let mut classes = std::collections::BTreeMap::<&str, usize>::new();
        for v in &report.violations {
            *classes.entry(class_of(v)).or_default() += 1;
        }
        shown(&format!("  violations by class: {classes:?}"));
        let strict = std::env::var("DELAYQ_CHAOS_STRICT").is_ok_and(|v| v == "1");
        let (known, failing): (Vec<String>, Vec<String>) = report
            .violations
            .into_iter()
            .partition(|v| !strict && KNOWN_DEFECTS.contains(&class_of(v)));
        if !known.is_empty() {
            eprintln!(
                "fault campaign seed {seed}: {} violation(s) of known defects {KNOWN_DEFECTS:?} (not failing; DELAYQ_CHAOS_STRICT=1 fails on them):\n{}",
                known.len(),
                known
                    .iter()
                    .take(20)
                    .map(|v| format!("  - {v}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if !failing.is_empty() {
            panic!(
                "fault campaign seed {seed}: {} violation(s):\n{}\nreproduce with: {}",
                failing.len(),
                failing
                    .iter()
                    .take(40)
                    .map(|v| format!("  - {v}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                cfg.reproduce()
            );
        }
    }
}
