-- dequeue.lua: move due orders, earliest first, from the schedule into the shard's stream.
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's STREAM       one entry per dispatched order
-- ARGV[1]  now, unix ms (the Redis server clock, read by the caller)
-- ARGV[2]  batch limit, 1..1000 (each order costs ~5 us of Redis time; keep calls short)
--
-- Returns: { moved, next_due_ms }  moved = orders written to the stream by this call,
--          next_due_ms = score of the earliest order still scheduled (nil when none).
--
-- Stream entry fields: id, due_ms, enqueued_ms, payload
--   plus flag = "payload_missing" (no HASH field: tampered; payload is "null", enqueued_ms "")
--          or flag = "bad_encoding" (HASH value without "<ms>:" prefix; payload is the raw value).
-- ZREM, HDEL and XADD happen in this one script, so no crash can lose an order between
-- "removed from the schedule" and "written to the stream". An order with no payload is still
-- forwarded, flagged, never dropped.
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
if not now then
  return redis.error_reply('ERR delayq dequeue: now must be unix milliseconds')
end
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR delayq dequeue: limit must be 1..1000')
end

local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
local n = #due / 2
if n > 0 then
  local ids = {}
  for i = 1, n do ids[i] = due[2 * i - 1] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  for i = 1, n do
    local v = vals[i]
    if v then
      local sep = string.find(v, ':', 1, true)
      local enq = sep and string.sub(v, 1, sep - 1)
      if enq and tonumber(enq) then
        redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', due[2 * i],
          'enqueued_ms', enq, 'payload', string.sub(v, sep + 1))
      else
        redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', due[2 * i],
          'enqueued_ms', '', 'payload', v, 'flag', 'bad_encoding')
      end
    else
      redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', due[2 * i],
        'enqueued_ms', '', 'payload', 'null', 'flag', 'payload_missing')
    end
  end
end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return { n, head[2] or false }
