//! The per-key slot scripts: `key_slots.lua` (a group's slots per order key, in one place
//! for every shard) and `park.lua` (entries waiting for a slot, on their lane).

use crate::engine::error::{RedisContext, Result};
use crate::engine::keys::KeySlotKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/key_slots.lua`.
pub static KEY_SLOTS_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/key_slots.lua")));
/// Source of `lua/park.lua`.
pub static PARK_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/park.lua")));

static KEY_SLOTS: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&KEY_SLOTS_LUA));
static PARK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&PARK_LUA));

/// What every `key_slots.lua` call carries: the group's keys, now, the slots per key and
/// how long the state lives after its last write.
pub(crate) struct SlotScope<'a> {
    pub keys: &'a KeySlotKeys,
    pub now_ms: i64,
    pub limit: u32,
    pub ttl_ms: i64,
}

impl SlotScope<'_> {
    fn invoke(&self, mode: &str, hold_ms: i64) -> redis::ScriptInvocation<'static> {
        let mut inv = KEY_SLOTS.prepare_invoke();
        for k in self.keys.all() {
            inv.key(k);
        }
        inv.arg(mode)
            .arg(self.now_ms)
            .arg(self.limit)
            .arg(self.ttl_ms)
            .arg(hold_ms);
        inv
    }
}

/// `key_slots.lua acquire`: a slot of `key` for `member` (`<lane>:<entry id>`), held until
/// `hold_ms`, or a place among the key's waiters (by `due_ms`). Answers whether it was
/// granted, and the waiters woken (see the script).
pub(crate) async fn acquire_key_slot<C: ConnectionLike>(
    conn: &mut C,
    scope: &SlotScope<'_>,
    hold_ms: i64,
    key: &str,
    member: &str,
    due_ms: i64,
) -> Result<(bool, Vec<String>)> {
    let mut inv = scope.invoke("acquire", hold_ms);
    inv.arg(key).arg(member).arg(due_ms);
    let (granted, woken): (i64, Vec<String>) = inv
        .invoke_async(conn)
        .await
        .ctx("taking a key slot (key_slots.lua)")?;
    Ok((granted == 1, woken))
}

/// `key_slots.lua release`: gives back the holds `(key, member)`; the waiters woken get
/// a slot held until `wake_hold_ms`. Answers them.
pub(crate) async fn release_key_slots<C: ConnectionLike>(
    conn: &mut C,
    scope: &SlotScope<'_>,
    wake_hold_ms: i64,
    holds: &[(String, String)],
) -> Result<Vec<String>> {
    let mut inv = scope.invoke("release", wake_hold_ms);
    for (k, m) in holds {
        inv.arg(k).arg(m);
    }
    let (woken,): (Vec<String>,) = inv
        .invoke_async(conn)
        .await
        .ctx("releasing key slots (key_slots.lua)")?;
    Ok(woken)
}

/// `key_slots.lua extend`: moves the holds `(key, member)` that still exist to `until_ms`.
pub(crate) async fn extend_key_slots<C: ConnectionLike>(
    conn: &mut C,
    scope: &SlotScope<'_>,
    until_ms: i64,
    holds: &[(String, String)],
) -> Result<i64> {
    let mut inv = scope.invoke("extend", until_ms);
    for (k, m) in holds {
        inv.arg(k).arg(m);
    }
    let (n,): (i64,) = inv
        .invoke_async(conn)
        .await
        .ctx("extending key slots (key_slots.lua)")?;
    Ok(n)
}

/// `key_slots.lua held`: whether `member` has a hold of `key` (given to it while it was
/// being parked).
pub(crate) async fn has_key_slot<C: ConnectionLike>(
    conn: &mut C,
    scope: &SlotScope<'_>,
    key: &str,
    member: &str,
) -> Result<bool> {
    let mut inv = scope.invoke("held", scope.now_ms);
    inv.arg(key).arg(member);
    let (held,): (i64,) = inv
        .invoke_async(conn)
        .await
        .ctx("looking up a key slot (key_slots.lua)")?;
    Ok(held == 1)
}

/// `park.lua park`: parks `(entry id, lease end last set)` of one lane until `until_ms`;
/// answers the ids parked.
pub(crate) async fn park<C: ConnectionLike>(
    conn: &mut C,
    timers: &str,
    errors: &str,
    until_ms: i64,
    held: &[(String, i64)],
) -> Result<Vec<String>> {
    let mut inv = PARK.prepare_invoke();
    inv.key(timers).key(errors).arg("park").arg(until_ms);
    for (id, lease) in held {
        inv.arg(id).arg(*lease);
    }
    inv.invoke_async(conn)
        .await
        .ctx("parking entries for a key slot (park.lua)")
}

/// `park.lua unpark`: moves the timers of the parked entries `ids` of one lane to `now_ms`;
/// answers the ids woken.
pub(crate) async fn unpark<C: ConnectionLike>(
    conn: &mut C,
    timers: &str,
    errors: &str,
    now_ms: i64,
    ids: &[String],
) -> Result<Vec<String>> {
    let mut inv = PARK.prepare_invoke();
    inv.key(timers)
        .key(errors)
        .arg("unpark")
        .arg(now_ms)
        .arg(ids);
    inv.invoke_async(conn)
        .await
        .ctx("waking entries parked for a key slot (park.lua)")
}
