//! The recurrence's unit tests: cron forms, time zones across daylight-saving changes,
//! intervals, windows and the bounds of the search.

use super::*;

/// Unix milliseconds of a UTC date-time.
fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
        .single()
        .expect("valid UTC date-time")
        .timestamp_millis()
}

fn cron(expr: &str, tz: Option<&str>) -> Recurrence {
    Recurrence::parse(Some(expr), None, tz, None, None).expect("valid cron")
}

fn every(interval: &str) -> Recurrence {
    Recurrence::parse(None, Some(interval), None, None, None).expect("valid interval")
}

/// The field an error names, and its message.
fn refused(result: Result<Recurrence, InvalidInput>) -> (&'static str, String) {
    match result {
        Err(e @ InvalidInput::Option { name, .. }) => (name, e.to_string()),
        Err(other) => panic!("unexpected error kind: {other}"),
        Ok(r) => panic!("accepted: {r:?}"),
    }
}

fn strictly_increasing(ticks: &[i64]) -> bool {
    ticks.windows(2).all(|w| w[0] < w[1])
}

#[test]
fn six_field_every_two_seconds_in_utc() {
    let r = cron("*/2 * * * * *", None);
    assert_eq!(r.timezone(), "UTC");
    let from = utc(2026, 5, 1, 12, 0, 0);
    assert_eq!(r.next_after(from), Some(utc(2026, 5, 1, 12, 0, 2)));
    assert_eq!(r.next_after(from + 1), Some(utc(2026, 5, 1, 12, 0, 2)));
    assert_eq!(r.next_after(from - 1), Some(from));
    assert_eq!(
        r.upcoming(from + 1_500, 3),
        vec![
            utc(2026, 5, 1, 12, 0, 2),
            utc(2026, 5, 1, 12, 0, 4),
            utc(2026, 5, 1, 12, 0, 6)
        ]
    );
    // Crossing a minute boundary: :58 then :00 of the next minute.
    let late = utc(2026, 5, 1, 12, 0, 57);
    assert_eq!(
        r.upcoming(late, 2),
        vec![utc(2026, 5, 1, 12, 0, 58), utc(2026, 5, 1, 12, 1, 0)]
    );
}

#[test]
fn six_field_daily_in_utc() {
    let r = cron("0 30 2 * * *", None);
    assert_eq!(
        r.next_after(utc(2026, 5, 1, 0, 0, 0)),
        Some(utc(2026, 5, 1, 2, 30, 0))
    );
    // Exactly at a tick: the next one, a day later.
    assert_eq!(
        r.next_after(utc(2026, 5, 1, 2, 30, 0)),
        Some(utc(2026, 5, 2, 2, 30, 0))
    );
    assert_eq!(
        r.next_after(utc(2026, 12, 31, 3, 0, 0)),
        Some(utc(2027, 1, 1, 2, 30, 0))
    );
}

#[test]
fn five_field_classic_form_means_second_zero() {
    let r = cron("30 2 * * *", None);
    assert_eq!(
        r.upcoming(utc(2026, 5, 1, 0, 0, 0), 2),
        vec![utc(2026, 5, 1, 2, 30, 0), utc(2026, 5, 2, 2, 30, 0)]
    );
    let r = cron("*/15 * * * *", None);
    assert_eq!(
        r.next_after(utc(2026, 5, 1, 10, 7, 31)),
        Some(utc(2026, 5, 1, 10, 15, 0))
    );
}

#[test]
fn seven_fields_and_overlong_expressions_are_refused() {
    for expr in ["0 0 9 1 1 * 2027", "*/5 * * * * * *", "0 0 12 * * ? 2286"] {
        let (name, message) = refused(Recurrence::parse(Some(expr), None, None, None, None));
        assert_eq!(name, "cron", "{expr:?}");
        assert!(message.contains("7 fields"), "{message}");
    }
    let long = format!("0 0 0 * * {}", "1,".repeat(200) + "1");
    let (name, message) = refused(Recurrence::parse(Some(&long), None, None, None, None));
    assert_eq!(name, "cron");
    assert!(message.contains("256"), "{message}");
}

#[test]
fn day_of_month_and_day_of_week_combine_with_and() {
    // Friday the 13th only, as tokio-cron-scheduler configures croner.
    let r = cron("0 0 12 13 * FRI", None);
    // 2026-02-13 and 2026-03-13 are Fridays; 2026-11-13 is the next one.
    assert_eq!(
        r.upcoming(utc(2026, 1, 1, 0, 0, 0), 3),
        vec![
            utc(2026, 2, 13, 12, 0, 0),
            utc(2026, 3, 13, 12, 0, 0),
            utc(2026, 11, 13, 12, 0, 0)
        ]
    );
}

#[test]
fn berlin_daily_in_winter_and_summer() {
    let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(r.timezone(), "Europe/Berlin");
    // CET (+01:00) in January, CEST (+02:00) in July.
    assert_eq!(
        r.next_after(utc(2026, 1, 10, 0, 0, 0)),
        Some(utc(2026, 1, 10, 1, 30, 0))
    );
    assert_eq!(
        r.next_after(utc(2026, 7, 10, 0, 0, 0)),
        Some(utc(2026, 7, 10, 0, 30, 0))
    );
}

#[test]
fn berlin_spring_forward_gap_fires_once_at_the_end_of_the_gap() {
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z); 02:30 does not exist.
    let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
    let ticks = r.upcoming(utc(2026, 3, 27, 12, 0, 0), 4);
    assert_eq!(
        ticks,
        vec![
            utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
            utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST, the first instant after the gap
            utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
            utc(2026, 3, 31, 0, 30, 0),
        ]
    );
    let day = utc(2026, 3, 29, 0, 0, 0)..utc(2026, 3, 30, 0, 0, 0);
    assert_eq!(ticks.iter().filter(|t| day.contains(t)).count(), 1);
}

#[test]
fn berlin_gap_collapses_several_matches_and_a_matching_gap_end() {
    // Every 20 minutes: 02:00, 02:20, 02:40 do not exist, 03:00 (the gap end) matches
    // itself: all four fire once, at 01:00Z.
    let r = cron("0 */20 * * * *", Some("Europe/Berlin"));
    let ticks = r.upcoming(utc(2026, 3, 29, 0, 30, 0), 4);
    assert_eq!(
        ticks,
        vec![
            utc(2026, 3, 29, 0, 40, 0), // 01:40 CET
            utc(2026, 3, 29, 1, 0, 0),  // the gap, and 03:00 CEST
            utc(2026, 3, 29, 1, 20, 0), // 03:20 CEST
            utc(2026, 3, 29, 1, 40, 0),
        ]
    );
    // Every second across the gap: 01:59:59 CET, then 03:00:00 CEST, 03:00:01 CEST.
    let r = cron("* * * * * *", Some("Europe/Berlin"));
    let gap_end = utc(2026, 3, 29, 1, 0, 0);
    assert_eq!(
        r.upcoming(gap_end - 2_000, 3),
        vec![gap_end - 1_000, gap_end, gap_end + 1_000]
    );
}

#[test]
fn berlin_fall_back_fires_once_at_the_first_occurrence() {
    // 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00Z); 02:30 happens at 00:30Z
    // and again at 01:30Z.
    let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
    let ticks = r.upcoming(utc(2026, 10, 23, 12, 0, 0), 4);
    assert_eq!(
        ticks,
        vec![
            utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
            utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST, the earlier occurrence
            utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
            utc(2026, 10, 27, 1, 30, 0),
        ]
    );
    let day = utc(2026, 10, 25, 0, 0, 0)..utc(2026, 10, 26, 0, 0, 0);
    assert_eq!(ticks.iter().filter(|t| day.contains(t)).count(), 1);
    // Asked from inside the second pass, the repeated 02:30 does not fire again.
    assert_eq!(
        r.next_after(utc(2026, 10, 25, 1, 15, 0)),
        Some(utc(2026, 10, 26, 1, 30, 0))
    );
}

#[test]
fn hourly_across_fall_back_has_no_duplicates() {
    let r = cron("0 0 * * * *", Some("Europe/Berlin"));
    let ticks = r.upcoming(utc(2026, 10, 24, 21, 30, 0), 8);
    assert!(strictly_increasing(&ticks), "{ticks:?}");
    assert_eq!(
        ticks,
        vec![
            utc(2026, 10, 24, 22, 0, 0), // 00:00 CEST
            utc(2026, 10, 24, 23, 0, 0), // 01:00 CEST
            utc(2026, 10, 25, 0, 0, 0),  // 02:00 CEST (02:00 CET at 01:00Z does not fire)
            utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
            utc(2026, 10, 25, 3, 0, 0),
            utc(2026, 10, 25, 4, 0, 0),
            utc(2026, 10, 25, 5, 0, 0),
            utc(2026, 10, 25, 6, 0, 0),
        ]
    );
}

#[test]
fn every_second_across_fall_back_is_strictly_increasing() {
    let r = cron("*/10 * * * * *", Some("Europe/Berlin"));
    let from = utc(2026, 10, 24, 23, 59, 0);
    let ticks = r.upcoming(from, 3 * 360);
    assert!(strictly_increasing(&ticks));
    // The repeated hour (01:00Z..02:00Z) has no ticks; 00:00Z..01:00Z and after 02:00Z do.
    let repeated = utc(2026, 10, 25, 1, 0, 0)..utc(2026, 10, 25, 2, 0, 0);
    assert!(!ticks.iter().any(|t| repeated.contains(t)));
    assert!(ticks.contains(&utc(2026, 10, 25, 0, 59, 50)));
    assert!(ticks.contains(&utc(2026, 10, 25, 2, 0, 0)));
    // Started inside the second pass: the next tick is after it, at 03:00 CET.
    assert_eq!(
        r.next_after(utc(2026, 10, 25, 1, 20, 5)),
        Some(utc(2026, 10, 25, 2, 0, 0))
    );
}

#[test]
fn new_york_dst_both_ways() {
    // 2026-03-08 02:30 does not exist in New York (02:00 EST -> 03:00 EDT = 07:00Z);
    // 2026-11-01 01:30 happens twice (05:30Z EDT, 06:30Z EST).
    let r = cron("0 30 2 * * *", Some("America/New_York"));
    assert_eq!(
        r.next_after(utc(2026, 3, 8, 0, 0, 0)),
        Some(utc(2026, 3, 8, 7, 0, 0))
    );
    let r = cron("0 30 1 * * *", Some("America/New_York"));
    assert_eq!(
        r.upcoming(utc(2026, 11, 1, 0, 0, 0), 2),
        vec![utc(2026, 11, 1, 5, 30, 0), utc(2026, 11, 2, 6, 30, 0)]
    );
}

#[test]
fn every_is_aligned_to_the_epoch() {
    let r = every("5m");
    assert_eq!(
        r.upcoming(utc(2026, 5, 1, 10, 7, 31) + 250, 3),
        vec![
            utc(2026, 5, 1, 10, 10, 0),
            utc(2026, 5, 1, 10, 15, 0),
            utc(2026, 5, 1, 10, 20, 0)
        ]
    );
    assert_eq!(
        r.next_after(utc(2026, 5, 1, 10, 10, 0)),
        Some(utc(2026, 5, 1, 10, 15, 0))
    );
    assert_eq!(r.next_after(-1), Some(0));
    assert_eq!(r.next_after(-300_000), Some(0));
    // The time zone does not move intervals.
    let berlin =
        Recurrence::parse(None, Some("5m"), Some("Europe/Berlin"), None, None).expect("valid");
    assert_eq!(berlin.timezone(), "Europe/Berlin");
    assert_eq!(
        berlin.next_after(utc(2026, 5, 1, 10, 7, 31)),
        Some(utc(2026, 5, 1, 10, 10, 0))
    );
    let r = every("1h30m");
    assert_eq!(r.next_after(0), Some(5_400_000));
    assert_eq!(every("1s").next_after(1_234), Some(2_000));
}

#[test]
fn every_is_anchored_at_start() {
    let start = utc(2026, 5, 1, 10, 7, 31);
    let r = Recurrence::parse(None, Some("5m"), None, Some(start), None).expect("valid");
    assert_eq!(
        r.upcoming(0, 3),
        vec![start, start + 300_000, start + 600_000]
    );
    assert_eq!(r.next_after(start), Some(start + 300_000));
    assert_eq!(r.next_after(start + 299_999), Some(start + 300_000));
}

#[test]
fn too_short_intervals_are_refused() {
    for text in ["10ms", "0s", "999ms", "0ms"] {
        let (name, message) = refused(Recurrence::parse(None, Some(text), None, None, None));
        assert_eq!(name, "every", "{text}");
        assert!(message.contains("1s"), "{message}");
    }
    for text in ["", "five minutes", "-5m", "5"] {
        let (name, _) = refused(Recurrence::parse(None, Some(text), None, None, None));
        assert_eq!(name, "every", "{text:?}");
    }
}

#[test]
fn unknown_time_zones_are_refused() {
    for tz in ["Mars/Olympus", "", "CEST+2", "Europe/Berlin/Mitte"] {
        let (name, message) = refused(Recurrence::parse(
            Some("0 0 * * * *"),
            None,
            Some(tz),
            None,
            None,
        ));
        assert_eq!(name, "timezone", "{tz:?}");
        assert!(message.contains("Europe/Berlin"), "{message}");
    }
    let (name, _) = refused(Recurrence::parse(
        None,
        Some("5m"),
        Some("Mars/Olympus"),
        None,
        None,
    ));
    assert_eq!(name, "timezone");
}

#[test]
fn time_zone_names_are_canonical() {
    assert_eq!(cron("0 0 * * * *", Some("UTC")).timezone(), "UTC");
    assert_eq!(
        cron("0 0 * * * *", Some(" europe/berlin ")).timezone(),
        "Europe/Berlin"
    );
    assert_eq!(
        cron("0 0 * * * *", Some("America/New_York")).timezone(),
        "America/New_York"
    );
}

#[test]
fn invalid_crons_are_refused() {
    for expr in [
        "61 * * * * *",
        "hello",
        "",
        "   ",
        "* * * *",
        "* * * * * * * *",
        "0 60 * * * *",
        "0 0 24 * * *",
        "0 0 0 32 * *",
        "0 0 0 * 13 *",
        "*/0 * * * * *",
    ] {
        let (name, message) = refused(Recurrence::parse(Some(expr), None, None, None, None));
        assert_eq!(name, "cron", "{expr:?}");
        assert!(message.starts_with("invalid option cron: "), "{message}");
    }
}

#[test]
fn exactly_one_of_cron_and_every() {
    for (c, e) in [(Some("0 0 * * * *"), Some("5m")), (None, None)] {
        let (name, message) = refused(Recurrence::parse(c, e, None, None, None));
        assert_eq!(name, "cron");
        assert!(
            message.contains("exactly one of cron and every"),
            "{message}"
        );
    }
}

#[test]
fn window_bounds_the_ticks() {
    let start = utc(2026, 5, 1, 10, 0, 0);
    let end = utc(2026, 5, 1, 10, 3, 0);
    let r =
        Recurrence::parse(Some("0 * * * * *"), None, None, Some(start), Some(end)).expect("valid");
    // Start and end are inclusive.
    assert_eq!(
        r.upcoming(0, 10),
        vec![start, start + 60_000, start + 120_000, end]
    );
    assert_eq!(r.next_after(end), None);
    assert_eq!(r.next_after(end - 1), Some(end));
    assert_eq!(r.next_after(i64::MAX), None);

    let r = Recurrence::parse(None, Some("1m"), None, None, Some(end)).expect("valid");
    assert_eq!(r.next_after(end - 60_000), Some(end));
    assert_eq!(r.next_after(end), None);

    // The first tick at or after start, not start itself, for a cron.
    let r =
        Recurrence::parse(Some("0 0 * * * *"), None, None, Some(start + 1), None).expect("valid");
    assert_eq!(r.next_after(0), Some(start + 3_600_000));

    for (s, e) in [(start, start), (start, start - 1)] {
        let (name, _) = refused(Recurrence::parse(
            Some("0 * * * * *"),
            None,
            None,
            Some(s),
            Some(e),
        ));
        assert_eq!(name, "end");
    }
}

#[test]
fn upcoming_gives_n_ticks() {
    let r = cron("0 0 9 * * MON-FRI", Some("Europe/Berlin"));
    // 2026-05-01 is a Friday; CEST is +02:00.
    assert_eq!(
        r.upcoming(utc(2026, 5, 1, 0, 0, 0), 5),
        vec![
            utc(2026, 5, 1, 7, 0, 0),
            utc(2026, 5, 4, 7, 0, 0),
            utc(2026, 5, 5, 7, 0, 0),
            utc(2026, 5, 6, 7, 0, 0),
            utc(2026, 5, 7, 7, 0, 0),
        ]
    );
    assert!(r.upcoming(0, 0).is_empty());
}

#[test]
fn ends_when_the_cron_never_matches_again() {
    // February 30th never exists. (A year field is refused: issue 39.)
    assert_eq!(cron("0 0 0 30 2 *", None).next_after(0), None);
    // Nothing to find within the search horizon (10 years): ended, and quickly.
    let started = std::time::Instant::now();
    assert_eq!(cron("0 0 0 31 4 *", None).next_after(0), None);
    assert_eq!(
        cron("0 0 0 30 2 *", Some("Europe/Berlin")).upcoming(utc(2026, 1, 1, 0, 0, 0), 2),
        Vec::<i64>::new()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // A leap day, four years later, is found.
    assert_eq!(
        cron("0 0 0 29 2 *", None).next_after(utc(2024, 3, 1, 0, 0, 0)),
        Some(utc(2028, 2, 29, 0, 0, 0))
    );
}

#[test]
fn extreme_instants_do_not_panic() {
    let crons = [
        cron("* * * * * *", Some("Europe/Berlin")),
        cron("0 0 0 1 1 *", Some("Pacific/Apia")),
    ];
    for r in &crons {
        for at in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            let _ = r.next_after(at);
            let _ = r.upcoming(at, 3);
        }
    }
    assert_eq!(crons[0].next_after(i64::MAX), None);
    let start = i64::MAX - 10;
    let r = Recurrence::parse(None, Some("10d"), None, Some(start), None).expect("valid");
    assert_eq!(r.next_after(i64::MIN), Some(start));
    assert_eq!(r.next_after(start), None);
    let r = every("10d");
    assert!(r.next_after(i64::MIN).is_some());
    assert_eq!(r.next_after(i64::MAX), None);
}

#[test]
fn random_strings_never_panic() {
    const ALPHABET: &[char] = &[
        '*', '/', ',', '-', '?', 'L', 'W', '#', '@', '+', ' ', ' ', ' ', '\t', '0', '1', '2', '3',
        '5', '7', '9', '6', 'M', 'O', 'N', 'J', 'A', 'F', 'S', 'x', 'é', 'ß', 'ﬀ',
    ];
    let mut rng = fastrand::Rng::with_seed(0x5eed_c0de);
    let mut accepted = 0;
    for _ in 0..600 {
        let len = rng.usize(0..24);
        let text: String = (0..len)
            .map(|_| ALPHABET[rng.usize(0..ALPHABET.len())])
            .collect();
        for result in [
            Recurrence::parse(Some(&text), None, None, None, None),
            Recurrence::parse(None, Some(&text), None, None, None),
            Recurrence::parse(Some("0 * * * * *"), None, Some(&text), None, None),
        ] {
            match result {
                Ok(r) => {
                    accepted += 1;
                    let ticks = r.upcoming(utc(2026, 3, 29, 0, 0, 0), 3);
                    assert!(strictly_increasing(&ticks), "{text:?}: {ticks:?}");
                }
                Err(InvalidInput::Option { name, .. }) => {
                    assert!(["cron", "every", "timezone"].contains(&name));
                }
                Err(other) => panic!("{text:?}: unexpected error kind {other}"),
            }
        }
    }
    // Also random field-shaped patterns, many of which are valid.
    let fields = [
        "*", "*/7", "0", "1-5", "L", "5W", "1#2", "MON", "0,30", "?", "59",
    ];
    for _ in 0..400 {
        let count = rng.usize(4..=8);
        let expr: Vec<&str> = (0..count)
            .map(|_| fields[rng.usize(0..fields.len())])
            .collect();
        let expr = expr.join(" ");
        if let Ok(r) = Recurrence::parse(Some(&expr), None, Some("Europe/Berlin"), None, None) {
            accepted += 1;
            let ticks = r.upcoming(utc(2026, 10, 24, 0, 0, 0), 3);
            assert!(strictly_increasing(&ticks), "{expr:?}: {ticks:?}");
        }
    }
    assert!(accepted > 0);
}
