//! Consumer-only tokens (`[[http.consumer_tokens]]`): a bearer token that may only pull
//! (`POST /v1/queues/{queue}/groups/{group}:receive`, `:ack`, `:nack`, `:extend`) from the
//! groups it names, so a consumer can neither schedule nor administer. Any other request
//! with it is 403 `forbidden_for_token`. The token is compared in constant time and never
//! printed.

use crate::engine::keys::{QueueName, validate_member_name};
use axum::http::Method;
use std::collections::HashSet;

/// The actions a consumer token may call.
const ACTIONS: &[&str] = &["receive", "ack", "nack", "extend"];

/// One consumer token and the groups it may pull from.
#[derive(Clone, PartialEq, Eq)]
pub struct ConsumerToken {
    token: String,
    /// (queue, group) pairs.
    groups: HashSet<(String, String)>,
}

impl std::fmt::Debug for ConsumerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut groups: Vec<String> = self
            .groups
            .iter()
            .map(|(q, g)| format!("{q}/{g}"))
            .collect();
        groups.sort();
        f.debug_struct("ConsumerToken")
            .field("token", &"hidden")
            .field("groups", &groups)
            .finish()
    }
}

impl ConsumerToken {
    /// A token (at least 8 characters, no whitespace) for `groups`, each `queue/group`;
    /// the error says which part is wrong (never quoting the token).
    pub fn new(token: &str, groups: &[String]) -> Result<Self, (Option<usize>, String)> {
        if token.trim().len() < 8 || token.chars().any(char::is_whitespace) {
            return Err((
                None,
                "the token must be at least 8 characters, without spaces".into(),
            ));
        }
        if groups.is_empty() {
            return Err((None, "name at least one group as \"queue/group\"".into()));
        }
        let mut set = HashSet::new();
        for (i, qg) in groups.iter().enumerate() {
            let Some((q, g)) = qg.split_once('/') else {
                return Err((Some(i), format!("{qg:?} is not \"queue/group\"")));
            };
            QueueName::new(q).map_err(|e| (Some(i), e.to_string()))?;
            validate_member_name("group", g).map_err(|e| (Some(i), e.to_string()))?;
            set.insert((q.to_owned(), g.to_owned()));
        }
        Ok(ConsumerToken {
            token: token.to_owned(),
            groups: set,
        })
    }

    /// The token itself (for the checks that it is no API token too).
    pub(crate) fn secret(&self) -> &str {
        &self.token
    }
}

/// The consumer token `given` is, if any (constant-time comparisons, all of them made).
pub(crate) fn find<'a>(tokens: &'a [ConsumerToken], given: &str) -> Option<&'a ConsumerToken> {
    let mut found = None;
    for t in tokens {
        if super::edge::same_secret(given, &t.token) && found.is_none() {
            found = Some(t);
        }
    }
    found
}

/// Whether `token` may make this request: a `POST` of a pull action on one of its groups.
/// The path is matched as sent (a percent-encoded name matches nothing).
pub(crate) fn allows(token: &ConsumerToken, method: &Method, path: &str) -> bool {
    if method != Method::POST {
        return false;
    }
    let Some(rest) = path.strip_prefix("/v1/queues/") else {
        return false;
    };
    let Some((queue, target)) = rest.split_once("/groups/") else {
        return false;
    };
    let Some((group, action)) = target.rsplit_once(':') else {
        return false;
    };
    ACTIONS.contains(&action)
        && !group.contains('/')
        && token.groups.contains(&(queue.to_owned(), group.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_token_allows_pull_actions_on_its_groups_only() {
        let t = ConsumerToken::new("consumer-1234", &["orders/close".into()]).unwrap();
        let post = Method::POST;
        for a in ACTIONS {
            assert!(allows(
                &t,
                &post,
                &format!("/v1/queues/orders/groups/close:{a}")
            ));
        }
        for (m, p) in [
            (&post, "/v1/queues/orders/groups/other:receive"),
            (&post, "/v1/queues/other/groups/close:receive"),
            (&post, "/v1/queues/orders/groups/close:delete"),
            (&post, "/v1/queues/orders/groups/close:receive/x"),
            (&post, "/v1/queues/orders:pause"),
            (&post, "/v1/queues/orders/messages:batch"),
            (&Method::PUT, "/v1/queues/orders/messages/o1"),
            (&Method::DELETE, "/v1/queues/orders/groups/close"),
            (&Method::GET, "/v1/queues/orders/groups/close:receive"),
            (&post, "/v1/queues/or%64ers/groups/close:receive"),
        ] {
            assert!(!allows(&t, m, p), "{m} {p}");
        }
        assert!(find(std::slice::from_ref(&t), "consumer-1234").is_some());
        assert!(find(std::slice::from_ref(&t), "consumer-12345").is_none());
        assert!(!format!("{t:?}").contains("consumer-1234"));
        for (token, groups) in [
            ("short", vec!["q/g".to_owned()]),
            ("with space x", vec!["q/g".to_owned()]),
            ("long-enough", vec![]),
            ("long-enough", vec!["nogroup".to_owned()]),
            ("long-enough", vec!["q/".to_owned()]),
        ] {
            let e = ConsumerToken::new(token, &groups).unwrap_err();
            assert!(!e.1.contains(token), "{e:?}");
        }
    }
}
