//! `delayq schedule QUEUE ID (--in D | --at T [--tz ZONE] | --debounce D --max-wait M)
//! [--payload JSON] [--if-absent] [--repeat] [--priority P] [--expires-after D] [--tag T]...
//! [--key K] [--cancel-on EVENT:FIELD[,FIELD][@REMEMBER]]...`.
//!
//! The order carries the caller's W3C trace context from `TRACEPARENT` and `TRACESTATE`
//! (the OpenTelemetry convention for command-line tools; see [`trace_from_env`]).

use super::{Command, Failure, Global, VerbResult, print_json};
use crate::engine::duration::parse_duration;
use crate::engine::message::{Mode, NewOrder, Payload, When};
use crate::engine::time_rules::Debounce;
use crate::engine::trace::TraceContext;
use crate::service::surface::{self, InQueue};

/// Runs the verb (`c` is a [`Command::Schedule`]).
pub(super) async fn run(g: &Global, c: Command) -> VerbResult {
    let Command::Schedule {
        queue,
        id,
        delay,
        at,
        tz,
        payload,
        if_absent,
        repeat,
        debounce,
        max_wait,
        priority,
        expires_after,
        tags,
        key,
        cancel_on,
    } = c
    else {
        return Err(Failure::Runtime("not a schedule command".into()));
    };
    // Validate everything that needs no server before connecting.
    // The due time: --in, --at (with --tz), or a debounce (clap lets --debounce come only
    // with --max-wait and without the others).
    let due = match (debounce, max_wait, delay, at, tz) {
        (Some(d), Some(m), None, None, None) => Due::Debounced(Debounce::new(
            parse_duration("--debounce", &d)?,
            parse_duration("--max-wait", &m)?,
        )?),
        (None, None, Some(d), None, None) => Due::At(When::from(parse_duration("--in", &d)?)),
        (None, None, None, Some(t), None) => Due::At(When::parse_at(&t)?),
        (None, None, None, Some(t), Some(z)) => Due::At(When::parse_local(&t, &z)?),
        _ => {
            return Err(Failure::Invalid(
                "give exactly one of --in, --at (--tz goes with --at) or --debounce with \
                 --max-wait"
                    .into(),
            ));
        }
    };
    let payload = Payload::from_json(&payload)?;
    surface::check_order_ref(&queue, &id)?;
    let mode = if if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    };
    let mut order = match due {
        Due::At(when) => NewOrder::new(id, when, payload),
        Due::Debounced(debounce) => NewOrder::debounced(id, debounce, payload),
    }
    .with_priority(priority.unwrap_or_default())
    .repeat(repeat);
    if let Some(e) = expires_after {
        order = order.with_expires_after(parse_duration("--expires-after", &e)?);
    }
    crate::engine::tags::validate(&tags)?;
    order = order.with_tags(tags);
    if let Some(k) = key {
        crate::engine::order_key::validate(&k)?;
        order = order.with_key(k);
    }
    let rules = cancel_on
        .iter()
        .map(|r| crate::engine::events::parse_rule(r))
        .collect::<Result<Vec<_>, _>>()?;
    crate::engine::events::validate_rules(&rules)?;
    order = order.with_cancel_on(rules);
    if let Some(t) = trace_from_env() {
        order = order.with_trace(t);
    }
    let value = g
        .connect()
        .await?
        .schedule_with(&queue, order, mode)
        .await?;
    print_json(&InQueue {
        queue: &queue,
        value,
    });
    Ok(())
}

/// When the order is due: a time, or a debounce.
enum Due {
    At(When),
    Debounced(Debounce),
}

/// The caller's trace context: `TRACEPARENT` (and `TRACESTATE`) from the environment, by
/// the rule the HTTP API applies to the headers of the same names ([`TraceContext::parse`]).
/// As there, an invalid value is never an error: an invalid `TRACEPARENT` is ignored (the
/// order is scheduled without context) and an invalid `TRACESTATE` dropped, each with a
/// warning on stderr naming the variable (not its value).
fn trace_from_env() -> Option<TraceContext> {
    let var = |name: &str| {
        std::env::var_os(name)
            .map(|v| v.into_string().unwrap_or_default())
            .filter(|v| !v.trim().is_empty())
    };
    let parent = var("TRACEPARENT")?;
    let state = var("TRACESTATE");
    let Some(t) = TraceContext::parse(&parent, state.as_deref()) else {
        tracing::warn!(
            "TRACEPARENT is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all \
             zeros): ignored, the order is scheduled without trace context"
        );
        return None;
    };
    if state.is_some() && t.tracestate().is_none() {
        tracing::warn!(
            "TRACESTATE is not a W3C tracestate (key=value members, at most {} bytes): ignored",
            crate::engine::trace::MAX_TRACESTATE_BYTES
        );
    }
    Some(t)
}
