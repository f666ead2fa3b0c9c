-- reschedule.lua: move a scheduled order to a new due time, keeping its payload; optionally
-- change its priority level.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's levels HASH (see enqueue.lua)
-- KEYS[3]  the shard's payload HASH, KEYS[4] its key index ZSET, KEYS[5] its key ring ZSET
--          (issue 42; see keyed.lua): a keyed order's member moves with it
--          Always all 5 KEYS (one arity; any other count is refused).
-- ARGV[1]  order id
-- ARGV[2]  new due time, unix ms
-- ARGV[3]  optional: the new level, "high", "normal" or "low" (absent: the level is kept)
--
-- Returns: 1 = rescheduled, 0 = not found (never scheduled, or already dispatched).
-- Why one script: the check and the writes go together, so a dispatched order is never
-- scheduled again by a reschedule. Every argument is checked first. Redis >= 6.2.
-- A move before the shard's earliest due time is published on its wake channel (include
-- `wake`). Cost: O(log n) in the shard's scheduled orders, one EXISTS (KEYS[5]), and while
-- the shard has keyed orders an HGET and O(log K) in the key index.
-- @include int, wake, keyed

-- int.lua: `int(s)`, the one check of an integer argument.
-- An include, not a script: a script that names it in its header (`-- @include int`)
-- gets it after its header (`engine::scripts::source`).

-- A canonical decimal integer within +-(2^53 - 1) (no spaces, exponents, hex, nan or inf,
-- nothing a double cannot hold exactly), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^-?[0-9]+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 or n < -9007199254740991 then return nil end
  return n
end

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

-- keyed.lua: helpers of the scripts that keep a shard's key index (issue 42: enqueue,
-- dequeue, cancel, reschedule, tag_bulk). An include, not a script: a script that names it
-- in its header (`-- @include keyed`) gets it after its header (`engine::scripts::source`).
--
-- The index exists only while the shard holds keyed orders (the meta HASH's field `keys`
-- says it may): the key index ZSET `{tag}:keyed` holds one member per keyed scheduled
-- order, "<key>\31<due ms, 16 digits>\31<order id>", every score 0 (read by lex range: one
-- key's orders in due order); the key ring ZSET `{tag}:key_ring` holds each key that has
-- scheduled orders, scored by its earliest due time. An order's key is read from its stored
-- value ("<enqueued_ms>:[!<ms>!]\30<key>\30..."): keys hold no control character. While the
-- shard is marked, unkeyed orders written are indexed too, under the empty key "" (members
-- "\31<due>\31<id>"): the unkeyed orders are then one participant of the rotation like a
-- key; unkeyed orders written before the mark have no member (the dispatcher finds those
-- among the earliest due orders).

-- Zeros that pad a due time of `i` digits to the member's 16.
local KEY_PAD = {}
for i = 1, 16 do KEY_PAD[i] = string.rep('0', 16 - i) end

-- The index member of an order of `key` due at `due` (unix ms): a number, or a string of
-- decimal digits (a checked argument, a score Redis returned), which is padded, not
-- formatted (string.format costs about half a microsecond per order).
local function key_member(key, due, id)
  if type(due) == 'string' and #due <= 16 then return key .. '\31' .. KEY_PAD[#due] .. due .. '\31' .. id end
  return key .. '\31' .. string.format('%016d', due) .. '\31' .. id
end

-- The bound `key_range` takes for the members due by `now`: the member's fixed-width due
-- time of now + 1.
local function key_due_bound(now)
  return string.format('%016d', now + 1)
end

-- The lex bounds of `key`'s members: those due before `bound` (a `key_due_bound`), or all
-- of them when `bound` is nil. Keys hold no control character, so no other key's member
-- falls between them.
local function key_range(key, bound)
  if bound then return '[' .. key .. '\31', '(' .. key .. '\31' .. bound end
  return '[' .. key .. '\31', '(' .. key .. '\32'
end

-- A member's fixed-width due time and its order id, cut at its key's length `kl` (no
-- pattern: the dispatcher's loop over a backlog's members).
local function key_cut(m, kl)
  return string.sub(m, kl + 2, kl + 17), string.sub(m, kl + 19)
end

-- A member's key, due time and order id.
local function key_parse(m)
  local k, d, id = string.match(m, '^([^\31]*)\31(%d+)\31(.*)$')
  return k, tonumber(d), id
end

-- The key of a stored value, or nil.
local function stored_key(v)
  if not v then return nil end
  return string.match(v, '^%d+:\30([^\30]+)\30') or string.match(v, '^%d+:!%d+!\30([^\30]+)\30')
end

-- One key's index members in due order, from `offset`, at most `count`.
local function key_orders(kidx, key, offset, count)
  local lo, hi = key_range(key)
  return redis.call('ZRANGE', kidx, lo, hi, 'BYLEX', 'LIMIT', offset, count)
end

-- Sets `key`'s ring score to its earliest indexed order's due time (at least `floor` when
-- given: the dispatcher passes its now for the keys it served, so they queue behind the
-- keys it did not serve), or takes it off the ring.
local function key_refresh(kidx, kring, key, floor)
  local head = key_orders(kidx, key, 0, 1)[1]
  if head then
    local _, due = key_parse(head)
    if floor and floor > due then due = floor end
    redis.call('ZADD', kring, due, key)
  else
    redis.call('ZREM', kring, key)
  end
end

-- Takes a scheduled order's member out of the index (its due time `due`, its stored value
-- `v`; an unkeyed order's is under ""), refreshing its key's ring score; returns the key
-- when there was a member, nil otherwise (an unkeyed order written before the mark).
local function key_unindex(kidx, kring, id, due, v)
  local key = stored_key(v) or ''
  if not due then return nil end
  if redis.call('ZREM', kidx, key_member(key, due, id)) == 1 then
    key_refresh(kidx, kring, key)
    return key
  end
  return nil
end

if #KEYS ~= 5 then return redis.error_reply('ERR delayq reschedule: 5 KEYS expected') end
local due = int(ARGV[2])
if not due or due < 0 then
  return redis.error_reply('ERR delayq reschedule: due_ms is not a number')
end
local level = ARGV[3]
if level and level ~= 'high' and level ~= 'normal' and level ~= 'low' then
  return redis.error_reply('ERR delayq reschedule: the level must be high, normal or low')
end
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
if old then
  local before = earliest(KEYS[1])
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
  if redis.call('EXISTS', KEYS[5]) == 1 then
    local key = key_unindex(KEYS[4], KEYS[5], ARGV[1], tonumber(old), redis.call('HGET', KEYS[3], ARGV[1]))
    if key then
      redis.call('ZADD', KEYS[4], 0, key_member(key, due, ARGV[1]))
      key_refresh(KEYS[4], KEYS[5], key)
    end
  end
  wake(KEYS[1], before, due)
  if level == 'normal' then
    redis.call('HDEL', KEYS[2], ARGV[1])
  elseif level then
    redis.call('HSET', KEYS[2], ARGV[1], level)
  end
  return 1
end
return 0
