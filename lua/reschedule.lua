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
