-- ack.lua: acknowledge handled entries and drop their timers.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard
-- ARGV[1]  group
-- ARGV[2..] entry ids
--
-- Returns: the number of entries acknowledged (XACK's reply).
if #ARGV < 2 then return 0 end
local n = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('ZREM', KEYS[2], unpack(ARGV, 2))
return n
