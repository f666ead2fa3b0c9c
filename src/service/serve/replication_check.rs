//! serve's start-up check of a replicated set-up: a warning when nothing keeps a failover
//! from discarding acknowledged orders (docs/production-redis.md, "What a failover loses").
//! The judgement ([`unprotected_replication`]) is pure and unit-tested.

use crate::engine::client::{Client, Durability};
use std::time::Duration;

/// Warns when serve runs on a replicated set-up (a Sentinel URL, or a master that reports
/// connected replicas) with nothing that keeps a failover from discarding acknowledged
/// orders: neither `min-replicas-to-write` on the master (`INFO replication` shows
/// `min_slaves_good_slaves` only when it is set) nor `durability = "replicated"`. See
/// docs/production-redis.md, "What a failover loses". A cluster is not checked (its nodes
/// answer `INFO` one by one); a refused `INFO` skips the check.
pub(super) async fn warn_if_acknowledged_writes_unprotected(client: &Client) {
    use crate::engine::conn::Conn;
    let mut conn = client.connection();
    let sentinel = match conn {
        Conn::Cluster(_) => return,
        Conn::Sentinel(_) => true,
        Conn::Single(_) => false,
    };
    let info = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("INFO")
            .arg("replication")
            .query_async::<String>(&mut conn),
    )
    .await;
    let Ok(Ok(info)) = info else { return };
    let durability = client.options().durability;
    match unprotected_replication(sentinel, &info, durability) {
        Some(Unprotected::Nothing(why)) => tracing::warn!(
            "{why} but nothing protects acknowledged writes from a failover: a forced failover \
             or the loss of the master can discard orders already acknowledged. Set \
             durability = \"replicated\" (a WAIT on every replica), with \
             min-replicas-to-write 1 and min-replicas-max-lag 10 on the master and its \
             replicas (docs/production-redis.md, \"What a failover loses\")"
        ),
        Some(Unprotected::Partly(why)) => tracing::warn!(
            "{why}: that does not protect acknowledged writes from a forced failover (the old \
             master's other replicas still confirm writes its demotion discards). Set \
             durability = \"replicated\" (a WAIT on every replica; docs/production-redis.md, \
             \"What a failover loses\")"
        ),
        None => {}
    }
}

/// What [`unprotected_replication`] found.
#[derive(Debug, PartialEq)]
enum Unprotected {
    /// A replicated set-up with no protection at all (why it is replicated).
    Nothing(String),
    /// A protection that a forced failover gets through (which one).
    Partly(String),
}

/// Whether a replicated set-up (a Sentinel URL, or a master that reports connected
/// replicas) leaves acknowledged writes unprotected from a failover (`None`: not
/// replicated, or `durability` waits for every replica), from the URL's kind, the master's
/// `INFO replication` and the client's durability. `min-replicas-to-write`, or a `WAIT` for
/// fewer replicas than the master has, protect only partly: a forced failover's old master
/// keeps a replica that confirms writes its demotion discards.
fn unprotected_replication(
    sentinel: bool,
    info: &str,
    durability: Durability,
) -> Option<Unprotected> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let replicas: u64 = field("connected_slaves")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let why = if sentinel {
        "redis is reached through sentinels (a replicated set-up)".to_owned()
    } else if replicas > 0 {
        format!("the redis master reports {replicas} connected replica(s)")
    } else {
        return None;
    };
    match durability {
        Durability::EveryReplica { .. } => None,
        Durability::Replicated { replicas: n, .. } if u64::from(n) >= replicas.max(1) => None,
        Durability::Replicated { replicas: n, .. } => Some(Unprotected::Partly(format!(
            "{why}, and durability waits for {n} replica(s) only"
        ))),
        _ if field("min_slaves_good_slaves").is_some() => Some(Unprotected::Partly(format!(
            "{why}, protected by min-replicas-to-write with durability = \"leader\""
        ))),
        _ => Some(Unprotected::Nothing(why)),
    }
}

#[cfg(test)]
mod replication_warning_tests {
    use super::{Durability, Unprotected, unprotected_replication};
    use std::time::Duration;

    #[test]
    fn a_replicated_set_up_without_every_replica_durability_is_named() {
        let bare = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n";
        let one = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=x\r\n";
        let two = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n";
        let guarded =
            "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmin_slaves_good_slaves:1\r\n";
        let leader = Durability::Leader;
        let every = Durability::replicated();
        let fixed = |replicas| Durability::Replicated {
            replicas,
            timeout: Duration::from_secs(1),
        };
        let nothing = |r: Option<Unprotected>| match r {
            Some(Unprotected::Nothing(why)) => why,
            other => panic!("{other:?}"),
        };
        let partly = |r: Option<Unprotected>| match r {
            Some(Unprotected::Partly(why)) => why,
            other => panic!("{other:?}"),
        };
        // Not replicated: nothing to say.
        assert_eq!(unprotected_replication(false, bare, leader), None);
        assert!(nothing(unprotected_replication(false, one, leader)).contains("1 connected"));
        assert!(nothing(unprotected_replication(true, bare, leader)).contains("sentinels"));
        // min-replicas-to-write alone, or a WAIT for fewer replicas than the master has,
        // protect only partly.
        assert!(partly(unprotected_replication(true, guarded, leader)).contains("min-replicas"));
        assert!(
            partly(unprotected_replication(false, two, fixed(1))).contains("1 replica(s) only")
        );
        assert_eq!(unprotected_replication(false, two, fixed(2)), None);
        // Every replica: protected.
        assert_eq!(unprotected_replication(false, one, every), None);
        assert_eq!(unprotected_replication(true, bare, every), None);
        assert_eq!(unprotected_replication(true, guarded, every), None);
    }
}
