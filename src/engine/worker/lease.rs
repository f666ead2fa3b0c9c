//! Lease extension: while this worker holds entries, their timers keep moving ahead.

use super::Shared;
use super::entry::ms;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Extends the leases of in-flight entries every third of the visibility timeout.
pub(super) async fn lease_loop<H>(s: Arc<Shared<H>>, stop: CancellationToken) {
    let every = s.opts.visibility_timeout / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let in_flight = s.in_flight.lock().await;
        if in_flight.is_empty() {
            continue;
        }
        let until = s.client.now_ms() + ms(s.opts.visibility_timeout);
        let mut by_shard: HashMap<u16, Vec<&str>> = HashMap::new();
        for (shard, id) in in_flight.iter() {
            by_shard.entry(*shard).or_default().push(id);
        }
        let mut conn = s.client.connection();
        for (shard, ids) in by_shard {
            // XX: only entries still leased; an acked or re-timed entry is left alone.
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(s.shards[usize::from(shard)].timers(&s.group))
                .arg("XX");
            for id in ids {
                cmd.arg(until).arg(id);
            }
            if let Err(e) = cmd.query_async::<i64>(&mut conn).await {
                tracing::warn!(error = %e, "extending leases failed; retrying next round");
            }
        }
    }
}
