-- enqueue.lua: schedule a batch of orders atomically (ZADD due time + HSET payload).
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's marker HASH  field epoch = the queue's epoch while it exists
-- KEYS[4]  optional: the shard's levels HASH (field = order id, value = high or low, for the
--          scheduled orders that are not normal). Given: the orders come as quadruples (see
--          ARGV) and each one's level is set; absent (producers that predate priorities):
--          triples, a new order is normal and an update keeps the level it had.
-- ARGV[1]  mode: "upsert" (a known id gets the new due time and payload)
--                or "nx" (a known id is left untouched)
-- ARGV[2]  now: the enqueue time, unix ms (the Redis server clock, read by the caller)
-- ARGV[3]  the queue's epoch as the caller read it from the registry record
-- ARGV[4..] the orders as triples: id, due_ms (integer), payload (JSON text), repeated;
--           with KEYS[4], quadruples: id, due_ms, payload, level ("high", "low", or "" or
--           "normal" for normal)
--
-- Numbers are canonical decimal integers ("^-?[0-9]+$", at most 2^53 - 1, not negative):
-- " 5", "5 ", "1e3", "0x10", "nan", "inf" and "" are refused. Redis >= 6.2.
--
-- Returns: an array with one code per order, in argument order:
--          1 = created, 2 = updated (upsert of a known id), 0 = unchanged (nx of a known id).
-- Errors:  "ERR delayq queue_not_found ..." when the shard has no epoch (the queue was
--          deleted, or is being deleted); "ERR delayq stale_epoch ..." when it has another
--          one (deleted and created again): the caller re-reads the registry and retries.
--          Either way nothing is written: a producer with a stale view can never write
--          into a deleted queue, because the delete removes the epoch first.
--
-- Every argument is checked before anything is written, so a rejected call changes nothing
-- (Redis does not roll back a script that fails half way). When the call makes the shard's
-- earliest due time earlier, it publishes that time on the shard's wake channel (prelude
-- `wake`): dispatchers in other processes look at the shard then.
local mode = ARGV[1]
if mode ~= 'upsert' and mode ~= 'nx' then
  return redis.error_reply('ERR delayq enqueue: mode must be upsert or nx')
end
local now = ARGV[2]
if not int(now) or int(now) < 0 then
  return redis.error_reply('ERR delayq enqueue: now must be unix milliseconds')
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq enqueue: the queue epoch is missing')
end
local w = 3
if KEYS[4] then w = 4 end
if (#ARGV - 3) % w ~= 0 then
  return redis.error_reply('ERR delayq enqueue: orders come as id, due_ms, payload' .. (w == 4 and ', level quadruples' or ' triples'))
end
local lanes = { [''] = '', normal = '', high = 'high', low = 'low' }
for i = 4, #ARGV, w do
  if ARGV[i] == '' then
    return redis.error_reply('ERR delayq enqueue: empty order id')
  end
  local due = int(ARGV[i + 1])
  if not due or due < 0 then
    return redis.error_reply('ERR delayq enqueue: due_ms of order ' .. ARGV[i] .. ' is not a number (a non-negative decimal integer)')
  end
  if w == 4 and not lanes[ARGV[i + 3]] then
    return redis.error_reply('ERR delayq enqueue: the level of order ' .. ARGV[i] .. ' must be high, normal or low')
  end
end

local epoch = redis.call('HGET', KEYS[3], 'epoch')
if not epoch then
  return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
end
if epoch ~= ARGV[3] then
  return redis.error_reply('ERR delayq stale_epoch: the queue was deleted and created again')
end

-- Which ids are known before the call: one ZMSCORE per 1,000 ids, then one ZADD and one
-- HSET per 500 orders instead of one of each per order (a call from Lua costs more than the
-- work it does for one order). An id given twice in one call behaves as two calls in order:
-- the later one is an update (upsert) or unchanged (nx).
local n = (#ARGV - 3) / w
local ids = {}
for k = 1, n do ids[k] = ARGV[w * (k - 1) + 4] end
local known = {}
for s = 1, n, 1000 do
  local e = math.min(s + 999, n)
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids, s, e))
  for k = s, e do known[k] = scores[k - s + 1] end
end
-- Levels (quadruples only): "high"/"low" set in the levels HASH, normal ones removed from
-- it (the last one given wins, as for the payload); a queue that never used a level has no
-- levels HASH and pays one EXISTS per call.
local seen, z, h, fin, out = {}, {}, {}, {}, {}
local had_levels = w == 4 and redis.call('EXISTS', KEYS[4]) == 1
for k = 1, n do
  local id = ids[k]
  local exists = known[k] or seen[id]
  local a = w * (k - 1) + 4
  if mode == 'nx' and exists then
    out[k] = 0
  else
    if exists then out[k] = 2 else out[k] = 1 end
    seen[id] = true
    z[#z + 1] = ARGV[a + 1]
    z[#z + 1] = id
    h[#h + 1] = id
    h[#h + 1] = now .. ':' .. ARGV[a + 2]
    if w == 4 then
      local level = lanes[ARGV[a + 3]]
      if level ~= '' or had_levels or fin[id] then fin[id] = level end
    end
  end
end
local before, first = earliest(KEYS[1]), nil
for s = 1, #z, 2 do first = math.min(first or math.huge, tonumber(z[s])) end
for s = 1, #z, 1000 do
  redis.call('ZADD', KEYS[1], unpack(z, s, math.min(s + 999, #z)))
  redis.call('HSET', KEYS[2], unpack(h, s, math.min(s + 999, #h)))
end
if w == 4 then
  local lv, plain = {}, {}
  for id, level in pairs(fin) do
    if level ~= '' then
      lv[#lv + 1] = id
      lv[#lv + 1] = level
    elseif had_levels then
      plain[#plain + 1] = id
    end
  end
  for s = 1, #plain, 1000 do
    redis.call('HDEL', KEYS[4], unpack(plain, s, math.min(s + 999, #plain)))
  end
  for s = 1, #lv, 1000 do
    redis.call('HSET', KEYS[4], unpack(lv, s, math.min(s + 999, #lv)))
  end
end
wake(KEYS[1], before, first)
return out
