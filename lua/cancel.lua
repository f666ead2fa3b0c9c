-- cancel.lua: remove one scheduled order (schedule entry, payload and level together).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  optional: the shard's levels HASH (see enqueue.lua)
-- KEYS[4]  optional: the shard's debounce HASH (see enqueue.lua)
-- KEYS[5]  optional (with KEYS[4]): the shard's key index ZSET, KEYS[6] its key ring ZSET
--          (issue 42; see keyed.lua): a keyed order's member goes with it
-- ARGV[1]  order id
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).
-- Why one script: the three go together, so no crash leaves a payload or level without its
-- schedule entry. Cost: O(log N) in the shard's scheduled orders (ZREM); with KEYS[6] one
-- EXISTS more, and while the shard has keyed orders a ZSCORE, an HGET and O(log K) in the key
-- index. Redis >= 6.2.
if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 1 then
  local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
  key_unindex(KEYS[5], KEYS[6], ARGV[1], tonumber(due), redis.call('HGET', KEYS[2], ARGV[1]))
end
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('HDEL', KEYS[3], ARGV[1]) end
if KEYS[4] then redis.call('HDEL', KEYS[4], ARGV[1]) end
return removed
