-- wake.lua: a shard's earliest due time and its cross-process wake-up.
-- An include, not a script: a script that names it in its header (`-- @include wake`)
-- gets it after its header (`engine::scripts::source`).

-- Cross-process wake-ups. `earliest(due)` is a shard's earliest due time (nil: none). After
-- a write that scheduled orders, the earliest of them due at `due_ms`, `wake(due, before,
-- due_ms)` publishes `due_ms` on the shard's wake channel (its due key with `wake` for
-- `due`: `{tag}:wake`) when it is earlier than the shard's earliest before the write:
-- every dispatcher of the queue listens there and looks at the shard then. Sharded
-- (`SPUBLISH`, Redis 7) where the server has it, `PUBLISH` on 6.2. Cost: O(1) + one
-- `ZRANGE 0 0`, O(log n), per call.
local function earliest(due)
  local f = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  return tonumber(f[2])
end
-- Publishes `msg` on the wake channel of the shard whose hash tag `key` carries
-- (`{tag}:...` -> `{tag}:wake`): an order's due time `<ms>` (for the dispatchers and the
-- waiting pull receives), or `t<ms>`, a group's timer (a pull consumer's retry, a replay:
-- for the waiting pull receives only; src/engine/listen.rs). A refused publish (no
-- SPUBLISH on 6.2; an ACL without the channel) never fails the write: the listeners'
-- fallback poll finds the work.
local function announce(key, msg)
  local channel = string.match(key, '^({[^}]*})') .. ':wake'
  local r = redis.pcall('SPUBLISH', channel, msg)
  if type(r) == 'table' and r.err then redis.pcall('PUBLISH', channel, msg) end
end
local function wake(due, before, due_ms)
  if due_ms and (not before or due_ms < before) then announce(due, due_ms) end
end
