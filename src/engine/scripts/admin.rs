//! The scripts of queue administration: statistics (`stats.lua`), an order's history and
//! redelivery to one group (`history.lua`, `redeliver.lua`), and the shared rate limiter
//! (`ratelimit.lua`). Their callers (`engine::admin::stats`, `engine::admin::history`,
//! `engine::flow`) build the invocations; the sources and the `Script`s live here, with the
//! others.

use std::sync::LazyLock;

/// Source of `lua/stats.lua`.
pub static STATS_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/stats.lua")));
/// Source of `lua/history.lua`.
pub static HISTORY_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/history.lua")));
/// Source of `lua/redeliver.lua`.
pub static REDELIVER_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/redeliver.lua")));
/// Source of `lua/ratelimit.lua`.
pub static RATELIMIT_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/ratelimit.lua")));

/// `stats.lua`, run by SHA (loaded again on `NOSCRIPT`).
pub(crate) static STATS: LazyLock<super::ReadOnly> =
    LazyLock::new(|| super::ReadOnly::new(&STATS_LUA));
/// `history.lua`.
pub(crate) static HISTORY: LazyLock<super::ReadOnly> =
    LazyLock::new(|| super::ReadOnly::new(&HISTORY_LUA));
/// `redeliver.lua`.
pub(crate) static REDELIVER: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&REDELIVER_LUA));
/// `ratelimit.lua`.
pub(crate) static RATELIMIT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&RATELIMIT_LUA));

/// `return 1`: the cheapest script there is, which `delayq bench`'s ceiling scenario runs to
/// measure the `EVALSHA` round trip alone.
pub static NOOP: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new("return 1"));
