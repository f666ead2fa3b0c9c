//! `delayq schedule QUEUE ID (--in D | --at T) [--payload JSON] [--if-absent] [--priority P]`.

use super::{Command, Failure, Global, VerbResult, print_json};
use crate::engine::duration::parse_duration;
use crate::engine::message::{Mode, NewOrder, Payload, When};
use crate::service::admin::{self, Admin};

/// Runs the verb (`c` is a [`Command::Schedule`]).
pub(super) async fn run(g: &Global, c: Command) -> VerbResult {
    let Command::Schedule {
        queue,
        id,
        delay,
        at,
        payload,
        if_absent,
        priority,
    } = c
    else {
        return Err(Failure::Runtime("not a schedule command".into()));
    };
    // Validate everything that needs no server before connecting.
    let when = match (delay, at) {
        (Some(d), None) => When::from(parse_duration("--in", &d)?),
        (None, Some(t)) => When::parse_at(&t)?,
        _ => return Err(Failure::Invalid("give exactly one of --in or --at".into())),
    };
    let payload = Payload::from_json(&payload)?;
    admin::check_order_ref(&queue, &id)?;
    let mode = if if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    };
    let a = Admin::connect(&g.redis_url, &g.namespace).await?;
    let answer = a
        .schedule(
            &queue,
            NewOrder::new(id, when, payload).with_priority(priority.unwrap_or_default()),
            mode,
        )
        .await?;
    print_json(&answer);
    Ok(())
}
