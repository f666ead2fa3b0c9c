-- cancel.lua: remove one scheduled order (schedule entry and payload together).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- ARGV[1]  order id
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return removed
