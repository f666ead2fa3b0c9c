-- get.lua: read one scheduled order (due time, stored payload, level) consistently.
--
-- Flags: no-writes (the first line): Redis 7.0+ runs it on read-only replicas and under
-- maxmemory, and refuses any write in it; older servers get the text without that line.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  the shard's levels HASH (see enqueue.lua)
-- KEYS[4]  the shard's debounce HASH (see enqueue.lua)
--          Always all 4 KEYS (one arity; any other count is refused).
-- ARGV[1]  order id
--
-- Returns: { due_ms or false, stored value ("<enqueued_ms>:<json>") or false,
--            level ("high" or "low") or false (normal),
--            the debounce record "<first call ms>:<cap ms>" or false }
-- Read-only; one script so the answer is one consistent snapshot. Cost: O(1) (ZSCORE,
-- HGETs). Redis >= 6.2.

if #KEYS ~= 4 then return redis.error_reply('ERR delayq get: 4 KEYS expected') end
return { redis.call('ZSCORE', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1]),
  redis.call('HGET', KEYS[3], ARGV[1]), redis.call('HGET', KEYS[4], ARGV[1]) }
