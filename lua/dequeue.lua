-- dequeue.lua: move due orders, earliest first, from the schedule into the shard's stream.
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's STREAM       one entry per dispatched order
-- ARGV[1]  now, unix ms (the Redis server clock, read by the caller)
-- ARGV[2]  batch limit, 1..1000 (each order costs several us of Redis time; keep calls short)
--
-- Returns: { moved, next_due_ms }  moved = orders written to the stream by this call,
--          next_due_ms = score of the earliest order still scheduled (nil when none).
--
-- Stream entry fields: id, due_ms, data = the HASH value as stored ("<enqueued_ms>:<json>",
-- split by the consumer so Redis does no string work), or, when the HASH field is missing
-- (tampered with), id, due_ms, flag = "payload_missing" and no data: still forwarded, never
-- dropped.
--
-- The due orders are exactly the lowest scores, so ZCOUNT + ZPOPMIN take them earliest first
-- in one pass (ties in member order, as ZRANGE would). ZPOPMIN, HDEL and XADD happen in this
-- one script, so no crash can lose an order between "removed" and "written".
-- A canonical decimal integer within +-2^53 (no spaces, exponents, hex, nan or inf), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^-?[0-9]+$') then return nil end
  return tonumber(s)
end
local now = int(ARGV[1])
local limit = int(ARGV[2])
if not now then
  return redis.error_reply('ERR delayq dequeue: now must be unix milliseconds')
end
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR delayq dequeue: limit must be 1..1000')
end

local n = redis.call('ZCOUNT', KEYS[1], '-inf', now)
if n > limit then n = limit end
if n > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], n)
  local ids = {}
  for i = 1, n do ids[i] = popped[2 * i - 1] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  for i = 1, n do
    local v = vals[i]
    if v then
      redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', popped[2 * i], 'data', v)
    else
      redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', popped[2 * i], 'flag', 'payload_missing')
    end
  end
end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return { n, head[2] or false }
