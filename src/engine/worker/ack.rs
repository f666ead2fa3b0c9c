//! Acknowledgements as pipelines (pure builders, unit-tested): which of a batch this
//! consumer still owns, `XACK`, the timers' `ZREM`, the error records' `HDEL` and the
//! history markers; and how many acks came late (the lease was taken over). The ack loop in
//! [`super::settle`] sends them.

use crate::engine::history::{HistoryPolicy, marker_field};
use crate::engine::keys::ShardKeys;
use std::collections::HashMap;

/// How many more of this consumer's pending entries, beyond the batch, one ownership check
/// reads (its other held entries and waiting retries interleave with the batch's ids).
const OWNED_SLACK: usize = 256;

/// One shard's acknowledgements as one pipeline: which of the entries this consumer still
/// owns (`XPENDING` over the batch's id range, filtered by consumer), `XACK`, then the
/// timers' `ZREM` and the error records' `HDEL` (plain commands cost less Redis time than a
/// script call; a crash between them only leaves a stale timer, which `reclaim.lua` drops).
/// Entries that needed several attempts also leave the history marker `a<attempts>`.
pub(super) fn ack_pipeline(
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    entries: &[(String, u32)],
    history: &HistoryPolicy,
    now_ms: i64,
) -> redis::Pipeline {
    let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
    let mut pipe = redis::pipe();
    let (first, last) = id_range(&ids);
    pipe.cmd("XPENDING")
        .arg(&keys.stream)
        .arg(group)
        .arg(first)
        .arg(last)
        .arg(ids.len() + OWNED_SLACK)
        .arg(consumer);
    ack_commands(&mut pipe, keys, group, entries, history, now_ms);
    pipe
}

/// What an acknowledgement writes for entries of one shard, appended to `pipe`: `XACK`
/// (its reply first), the timers' `ZREM`, the error records' `HDEL` and the history markers
/// ([`ack_pipeline`] less its ownership check: a pull's compare-and-set on each lease
/// settled ownership already).
pub(super) fn ack_commands(
    pipe: &mut redis::Pipeline,
    keys: &ShardKeys,
    group: &str,
    entries: &[(String, u32)],
    history: &HistoryPolicy,
    now_ms: i64,
) {
    let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
    pipe.cmd("XACK").arg(&keys.stream).arg(group).arg(&ids);
    pipe.cmd("ZREM").arg(keys.timers(group)).arg(&ids);
    // Always: an ack by a previous owner (whose attempt 1 another consumer retried) must
    // not leave the new attempt's error record behind.
    pipe.cmd("HDEL").arg(keys.errors(group)).arg(&ids);
    let retried: Vec<&(String, u32)> = entries.iter().filter(|(_, n)| *n > 1).collect();
    if retried.is_empty() {
        return;
    }
    let mut buckets: HashMap<String, (i64, Vec<(String, String)>)> = HashMap::new();
    for (id, n) in retried.iter().copied() {
        let (bucket, expires_at) = history.marker_target(keys, id);
        if expires_at > 0 {
            buckets
                .entry(bucket)
                .or_insert((expires_at, Vec::new()))
                .1
                .push((marker_field(group, id), format!("a{n}")));
        }
    }
    for (bucket, (expires_at, fields)) in buckets {
        pipe.cmd("HSET").arg(&bucket).arg(fields);
        pipe.cmd("PEXPIREAT").arg(&bucket).arg(expires_at);
    }
    // After the markers: a stats read between the two sees the touch again next time.
    for (id, _) in retried {
        history.touch(pipe, keys, id, now_ms);
    }
}

/// The lowest and highest of stream entry ids (`<ms>-<seq>`), compared as ids.
fn id_range<'a>(ids: &[&'a str]) -> (&'a str, &'a str) {
    let key = |id: &&str| -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    let first = ids.iter().copied().min_by_key(key).unwrap_or("-");
    let last = ids.iter().copied().max_by_key(key).unwrap_or("+");
    (first, last)
}

/// How many of `entries` this consumer did not own when it acknowledged them, from the
/// ownership check's reply (its pending entries over the batch's range, in id order). When
/// the reply was cut at its count, ids past its last one are not judged (never counted
/// late without proof).
pub(super) fn late_acks(entries: &[(String, u32)], owned: Option<redis::Value>) -> u64 {
    let Some(redis::Value::Array(rows)) = owned else {
        return 0;
    };
    let ids: Vec<String> = rows
        .iter()
        .filter_map(|r| match r {
            redis::Value::Array(f) => f.first().and_then(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
                redis::Value::SimpleString(s) => Some(s.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    let cut = rows.len() >= entries.len() + OWNED_SLACK;
    let last = ids.last().map(String::as_str);
    let mine: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    let judged = |id: &str| !cut || last.is_some_and(|l| id_range(&[id, l]).1 == l);
    entries
        .iter()
        .filter(|(id, _)| !mine.contains(id.as_str()) && judged(id))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(ids: &[&str]) -> Vec<(String, u32)> {
        ids.iter().map(|i| ((*i).to_owned(), 1)).collect()
    }

    /// `XPENDING`'s reply rows for `ids` (id, consumer, idle, deliveries).
    fn rows(ids: &[&str]) -> redis::Value {
        redis::Value::Array(
            ids.iter()
                .map(|i| {
                    redis::Value::Array(vec![
                        redis::Value::BulkString(i.as_bytes().to_vec()),
                        redis::Value::BulkString(b"c".to_vec()),
                        redis::Value::Int(1),
                        redis::Value::Int(1),
                    ])
                })
                .collect(),
        )
    }

    #[test]
    fn the_id_range_compares_ids_as_numbers_not_text() {
        assert_eq!(id_range(&["9-1", "10-0", "10-2"]), ("9-1", "10-2"));
        assert_eq!(id_range(&["5-10", "5-9"]), ("5-9", "5-10"));
    }

    #[test]
    fn acks_of_entries_this_consumer_no_longer_owns_are_counted_late() {
        let batch = entries(&["1-0", "2-0", "3-0"]);
        // It still owns 1-0 and 3-0: 2-0 was taken over.
        assert_eq!(late_acks(&batch, Some(rows(&["1-0", "3-0"]))), 1);
        assert_eq!(late_acks(&batch, Some(rows(&["1-0", "2-0", "3-0"]))), 0);
        // No reply (the check failed): nothing is counted without proof.
        assert_eq!(late_acks(&batch, None), 0);
    }

    #[test]
    fn a_cut_ownership_reply_judges_only_the_ids_it_covers() {
        let batch = entries(&["1-0", "900-0"]);
        // A reply cut at its count (batch + slack rows) that ends at 500-0 proves nothing
        // about 900-0.
        let ids: Vec<String> = (0..batch.len() + OWNED_SLACK)
            .map(|k| format!("{}-0", 2 + k))
            .collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        // 1-0 is before the reply's last id and not in it: late; 900-0 is past it: not judged.
        assert_eq!(late_acks(&batch, Some(rows(&refs))), 1);
    }

    #[test]
    fn an_ack_pipeline_checks_ownership_first_and_marks_only_retried_entries() {
        let keys = crate::engine::keys::Keyspace::new("dq")
            .unwrap()
            .shard(&crate::engine::keys::QueueName::new("q").unwrap(), 0);
        let history = HistoryPolicy::from_ms(0);
        let once = ack_pipeline(&keys, "g", "c", &entries(&["1-0", "2-0"]), &history, 0);
        let cmds: Vec<String> = once
            .cmd_iter()
            .map(|c| String::from_utf8_lossy(&c.get_packed_command()).into_owned())
            .collect();
        assert_eq!(cmds.len(), 4, "XPENDING, XACK, ZREM, HDEL: {cmds:?}");
        assert!(cmds[0].contains("XPENDING") && cmds[1].contains("XACK"));
        assert!(
            !cmds.iter().any(|c| c.contains("HSET")),
            "no history marker for first attempts"
        );
    }
}
