-- retry.lua: schedule the next attempt of a failed entry (the entry stays pending), and
-- record the failed attempt's error for the order history.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard
-- KEYS[3]  the group's errors HASH for this shard: entry id -> "<attempt>:<error>" (the last
--          failed attempt of an entry still pending; removed when it is acked or dead)
-- ARGV[1]  group
-- ARGV[2]  consumer that failed it
-- ARGV[3]  entry id
-- ARGV[4]  next attempt, unix ms
-- ARGV[5]  the error (already redacted and bounded by the caller)
-- ARGV[6]  "wake": announce the retry's time on the shard's wake channel as a group timer
--          (`t<ms>`, wake.lua), so the group's waiting pull receives in every process read
--          then (a pull group's hand-back; dispatchers ignore it); "" or absent: nothing is
--          published (a worker's own reclaim loop knows its retries)
--
-- Returns: 1 = scheduled; 0 = the entry is no longer this consumer's (acked, or reclaimed by
-- another consumer after this one's lease ran out): nothing is changed.
-- Why one script: the ownership check (XPENDING by id), the timer and the error record move
-- together, so a retry can never overwrite another consumer's lease. Cost: O(log t) in the
-- group's timers (XPENDING of one id, ZADD, HSET), and O(1) for the announce. Redis >= 6.2.
-- @include int, wake
if not int(ARGV[4]) then
  return redis.error_reply('ERR delayq retry: next attempt must be unix milliseconds')
end
if type(ARGV[5]) ~= 'string' then
  return redis.error_reply('ERR delayq retry: the error is missing')
end
if ARGV[6] and ARGV[6] ~= '' and ARGV[6] ~= 'wake' then
  return redis.error_reply('ERR delayq retry: ARGV[6] must be "wake" or ""')
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[3], p[1][4] .. ':' .. ARGV[5])
if ARGV[6] == 'wake' then announce(KEYS[1], 't' .. ARGV[4]) end
return 1
