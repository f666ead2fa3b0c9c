-- read.lua: take new entries of a shard's stream for one consumer and lease them, atomically.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard   member = entry id, score = unix ms after
--          which the entry may be taken by another consumer (lease end, or retry time)
-- KEYS[3]  the shard's marker HASH: while its field `paused:<group>` is set, nothing is read
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  count, 1..1000
-- ARGV[4]  lease end, unix ms (now + visibility timeout)
-- ARGV[5]  optional: "lane" when KEYS[1] is a high or low priority lane, whose stream exists
--          only once an order of its level was dispatched: then a missing stream is an empty
--          lane, not a missing group
--
-- Returns: { entries, last_id, paused, lanes, missing }
--   entries = XREADGROUP's entries for this stream ([id, [field, value, ...]], ...), or {}
--   last_id = id of the stream's last entry ("0-0" when empty): a consumer that got fewer than
--             count entries may block with XREAD on entries after it.
--   paused  = 1 when the group is paused (then entries is empty): checked here, so no read
--             starts once a pause has been written.
--   lanes   = which priority lanes of the shard are in use: 1 (high) + 2 (low), from the
--             marker's lane:high / lane:low fields (read in the same HMGET as the pause flag),
--             so a reader busy with one lane learns of a new one without another call.
--   missing = 1 when the lane's stream does not exist (ARGV[5] = "lane" only).
--
-- XREADGROUP (which puts the entries in the consumer's pending list) and the lease (ZADD into
-- the timers ZSET) happen together, so no crash can leave a pending entry without a timer:
-- every pending entry is reclaimed in O(log n) through the timers, never by scanning.
-- Cost: O(c log t) for c entries read (XREADGROUP, at most ARGV[3]) and leased in a timers
-- ZSET of t; nothing to read: the marker's HMGET and one XREADGROUP. Redis >= 6.2.
-- @include int
if not int(ARGV[4]) then
  return redis.error_reply('ERR delayq read: lease end must be unix milliseconds')
end
local count = int(ARGV[3])
if not count or count < 1 or count > 1000 then
  return redis.error_reply('ERR delayq read: count must be 1..1000')
end
local function last_id()
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return '0-0'
end
local flags = redis.call('HMGET', KEYS[3], 'paused:' .. ARGV[1], 'lane:high', 'lane:low')
local lanes = 0
if flags[2] then lanes = lanes + 1 end
if flags[3] then lanes = lanes + 2 end
if flags[1] then
  return { {}, last_id(), 1, lanes, 0 }
end
local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count,
  'STREAMS', KEYS[1], '>')
if type(reply) == 'table' and reply.err then
  if ARGV[5] == 'lane' and redis.call('EXISTS', KEYS[1]) == 0 then
    return { {}, '0-0', 0, lanes, 1 }
  end
  return reply
end
local entries = {}
if reply and reply[1] then
  entries = reply[1][2]
  local z = {}
  for i, e in ipairs(entries) do
    z[2 * i - 1] = ARGV[4]
    z[2 * i] = e[1]
  end
  if #z > 0 then redis.call('ZADD', KEYS[2], unpack(z)) end
end
-- Fewer entries than asked (and some): they reach the end of the stream, so the last one
-- is the stream's last id, without another command.
if #entries > 0 and #entries < count then
  return { entries, entries[#entries][1], 0, lanes, 0 }
end
return { entries, last_id(), 0, lanes, 0 }
