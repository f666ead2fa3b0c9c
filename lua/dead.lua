-- dead.lua: move a failed entry to the dead-letter stream and acknowledge it, atomically,
-- and mark it dead in the order history.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard
-- KEYS[3]  the shard's dead-letter STREAM
-- KEYS[4]  the group's errors HASH for this shard (see retry.lua): the entry's field is removed
-- KEYS[5]  the shard's history bucket of the entry (by the entry id's time; see dequeue.lua):
--          "...:history:<bucket ms>:<bucket number>"
-- KEYS[6]  the shard's history touched log ZSET (bucket number -> last marker write, ms):
--          the bucket may be sealed, and the stats' count cache re-counts what it names
-- ARGV[1]  group
-- ARGV[2]  consumer that failed it
-- ARGV[3]  entry id
-- ARGV[4]  attempts made (the delivery count)
-- ARGV[5]  last error
-- ARGV[6]  now, unix ms
-- ARGV[7]  the history marker field of (group, entry): "\1<group>\1<entry id>"
-- ARGV[8]  when the history bucket expires, unix ms (0 = history off: KEYS[5] is untouched)
-- ARGV[9]  how long the touched log keeps a write, ms (src/engine/history.rs, TOUCH_KEEP_MS)
-- ARGV[10] optional: the entry expired (see src/engine/expiry.rs): how late, ms, its hand-off
--          to the group would have been past due + expires_after. The dead letter then
--          also carries reason = expired and late_ms, and the history marker is
--          "x<attempts>:<late ms>:<dead-letter id>" (the group's state reads `expired`).
--
-- Dead-letter entry fields: the original entry's fields (id, due_ms, data or flag) followed by
-- group, attempts, error, dead_ms, entry (the original stream entry id), and for an expired
-- entry reason = expired, late_ms. The history marker
-- is "d<attempts>:<dead-letter id>".
-- Cost: O(log n) in the pending list and the streams (XPENDING and XRANGE by id, XADD, XACK,
-- ZREM, HDEL, HSET, and the touched log's ZADD and trim, O(log n) in the buckets touched
-- within TOUCH_KEEP_MS): one entry per call; the expired form adds two fields, nothing more.
-- Returns: 1 = dead-lettered; 0 = the entry is no longer this consumer's (nothing changed).
-- Why one script: the dead letter, the XACK and the timer go together, so an entry is never
-- both acknowledged and lost, nor dead-lettered twice. Redis >= 6.2.
-- @include int
if not int(ARGV[4]) or not int(ARGV[6]) then
  return redis.error_reply('ERR delayq dead: attempts and now must be integers')
end
local hist_at = int(ARGV[8])
if not hist_at or hist_at < 0 or type(ARGV[7]) ~= 'string' then
  return redis.error_reply('ERR delayq dead: history marker and expiry expected')
end
local keep = int(ARGV[9])
local bucket = string.match(KEYS[5], ':(%-?%d+)$')
if not keep or keep < 1 or not bucket then
  return redis.error_reply('ERR delayq dead: history bucket key and touched-log span expected')
end
local late = ARGV[10]
if late ~= nil and (not int(late) or int(late) < 0) then
  return redis.error_reply('ERR delayq dead: the lateness of an expired entry must be ms')
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return 0 end
local fields = {}
local e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if e[1] then
  for _, v in ipairs(e[1][2]) do fields[#fields + 1] = v end
else
  fields = { 'flag', 'entry_missing' }
end
local skip = { group = true, attempts = true, error = true, dead_ms = true, entry = true, for_group = true,
  reason = true, late_ms = true }
local out = {}
for i = 1, #fields, 2 do
  if not skip[fields[i]] then
    out[#out + 1] = fields[i]
    out[#out + 1] = fields[i + 1]
  end
end
out[#out + 1] = 'group';    out[#out + 1] = ARGV[1]
out[#out + 1] = 'attempts'; out[#out + 1] = ARGV[4]
out[#out + 1] = 'error';    out[#out + 1] = ARGV[5]
out[#out + 1] = 'dead_ms';  out[#out + 1] = ARGV[6]
out[#out + 1] = 'entry';    out[#out + 1] = ARGV[3]
if late then
  out[#out + 1] = 'reason';  out[#out + 1] = 'expired'
  out[#out + 1] = 'late_ms'; out[#out + 1] = late
end
local did = redis.call('XADD', KEYS[3], '*', unpack(out))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
if hist_at > 0 then
  if late then
    redis.call('HSET', KEYS[5], ARGV[7], 'x' .. ARGV[4] .. ':' .. late .. ':' .. did)
  else
    redis.call('HSET', KEYS[5], ARGV[7], 'd' .. ARGV[4] .. ':' .. did)
  end
  redis.call('PEXPIREAT', KEYS[5], hist_at)
  local now = int(ARGV[6])
  redis.call('ZADD', KEYS[6], 'GT', now, bucket)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. (now - keep))
  redis.call('PEXPIRE', KEYS[6], keep)
end
return 1
