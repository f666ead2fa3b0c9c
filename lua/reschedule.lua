-- reschedule.lua: move a scheduled order to a new due time, keeping its payload.
--
-- KEYS[1]  the shard's due ZSET
-- ARGV[1]  order id
-- ARGV[2]  new due time, unix ms
--
-- Returns: 1 = rescheduled, 0 = not found (never scheduled, or already dispatched).
local due = int(ARGV[2])
if not due or due < 0 then
  return redis.error_reply('ERR delayq reschedule: due_ms is not a number')
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
  return 1
end
return 0
