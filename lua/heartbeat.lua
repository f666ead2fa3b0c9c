-- heartbeat.lua: record that a consumer is alive (or stopped), while its queue exists.
--
-- KEYS[1]  the queue's heartbeats ZSET (member "<group>\1<consumer>", score = unix ms)
-- KEYS[2]  shard 0's marker HASH (field epoch while the queue exists)
-- ARGV[1]  member
-- ARGV[2]  now, unix ms
-- ARGV[3]  "1" = alive, "0" = stopped
-- ARGV[4]  heartbeats older than this (unix ms) are dropped
--
-- Returns: 1, or 0 when the queue does not exist (nothing written: a worker of a deleted
-- queue leaves no key behind).
-- Why one script: the existence check and the write go together. KEYS[1] and KEYS[2]
-- share shard 0's hash tag. Cost: O(log C + D) in the queue's consumers C and the
-- heartbeats dropped D. Redis >= 6.2.
-- @include int
if type(ARGV[1]) ~= 'string' or not int(ARGV[2]) or not int(ARGV[4]) then
  return redis.error_reply('ERR delayq heartbeat: member, now and cutoff expected')
end
if ARGV[3] ~= '0' and ARGV[3] ~= '1' then
  return redis.error_reply('ERR delayq heartbeat: alive must be 0 or 1')
end
if redis.call('HEXISTS', KEYS[2], 'epoch') == 0 then return 0 end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[4])
return 1
