-- get.lua: read one scheduled order (due time and stored payload) consistently.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- ARGV[1]  order id
--
-- Returns: { due_ms or false, stored value ("<enqueued_ms>:<json>") or false }
return { redis.call('ZSCORE', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1]) }
