//! `delayq cancel --tag T [--queue Q]`, `delayq list --tag T [--queue Q]` and `delayq
//! reschedule --tag T (--in D | --at T | --shift D) [--queue Q]` (issue 43): every scheduled
//! order that carries a tag, in one queue or in every queue of the namespace.

use super::{Failure, Global, VerbResult, print_json};
use crate::engine::client::tags::TagMove;
use crate::engine::duration::{ms, parse_duration};
use crate::engine::message::When;
use crate::engine::tags::validate_tag;

/// `delayq cancel --tag`: prints the counts (`{"total": n, "queues": {...}}`).
pub(super) async fn cancel(g: &Global, queue: Option<&str>, tag: &str) -> VerbResult {
    validate_tag(tag)?;
    let client = g.connect().await?;
    print_json(&client.tag_cancel(queue, tag).await?);
    Ok(())
}

/// `delayq list --tag`: one line per order, then `{"next": cursor}` when more may follow.
pub(super) async fn list(
    g: &Global,
    queue: Option<&str>,
    tag: &str,
    limit: usize,
    after: Option<&str>,
) -> VerbResult {
    validate_tag(tag)?;
    let client = g.connect().await?;
    let page = client.tag_list(queue, tag, limit, after).await?;
    for o in &page.orders {
        print_json(o);
    }
    if let Some(next) = page.next {
        print_json(&serde_json::json!({ "next": next }));
    }
    Ok(())
}

/// `delayq reschedule --tag`: prints the counts.
pub(super) async fn reschedule(
    g: &Global,
    queue: Option<&str>,
    tag: &str,
    delay: Option<String>,
    at: Option<String>,
    shift: Option<String>,
) -> VerbResult {
    validate_tag(tag)?;
    let to = match (delay, at, shift) {
        (Some(d), None, None) => TagMove::At(When::from(parse_duration("--in", &d)?)),
        (None, Some(t), None) => TagMove::At(When::parse_at(&t)?),
        (None, None, Some(s)) => {
            let (sign, text) = match s.strip_prefix('-') {
                Some(rest) => (-1, rest),
                None => (1, s.as_str()),
            };
            TagMove::ShiftMs(sign * ms(parse_duration("--shift", text)?))
        }
        _ => {
            return Err(Failure::Invalid("give one of --in, --at or --shift".into()));
        }
    };
    let client = g.connect().await?;
    print_json(&client.tag_reschedule(queue, tag, to).await?);
    Ok(())
}
