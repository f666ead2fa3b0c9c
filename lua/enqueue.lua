-- enqueue.lua: schedule a batch of orders atomically (ZADD due time + HSET payload).
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- ARGV[1]  mode: "upsert" (a known id gets the new due time and payload)
--                or "nx" (a known id is left untouched)
-- ARGV[2]  now: the enqueue time, unix ms (the Redis server clock, read by the caller)
-- ARGV[3..] the orders as triples: id, due_ms (integer), payload (JSON text), repeated
--
-- Numbers are canonical decimal integers ("^-?[0-9]+$", at most 16 characters, not negative):
-- " 5", "5 ", "1e3", "0x10", "nan", "inf" and "" are refused. Redis >= 6.2.
--
-- Returns: an array with one code per order, in argument order:
--          1 = created, 2 = updated (upsert of a known id), 0 = unchanged (nx of a known id).
--
-- Every argument is checked before anything is written, so a rejected call changes nothing
-- (Redis does not roll back a script that fails half way).
-- A canonical decimal integer within +-2^53 (no spaces, exponents, hex, nan or inf), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^-?[0-9]+$') then return nil end
  return tonumber(s)
end
local mode = ARGV[1]
if mode ~= 'upsert' and mode ~= 'nx' then
  return redis.error_reply('ERR delayq enqueue: mode must be upsert or nx')
end
local now = ARGV[2]
if not int(now) or int(now) < 0 then
  return redis.error_reply('ERR delayq enqueue: now must be unix milliseconds')
end
if (#ARGV - 2) % 3 ~= 0 then
  return redis.error_reply('ERR delayq enqueue: orders come as id, due_ms, payload triples')
end
for i = 3, #ARGV, 3 do
  if ARGV[i] == '' then
    return redis.error_reply('ERR delayq enqueue: empty order id')
  end
  local due = int(ARGV[i + 1])
  if not due or due < 0 then
    return redis.error_reply('ERR delayq enqueue: due_ms of order ' .. ARGV[i] .. ' is not a number (a non-negative decimal integer)')
  end
end

local out = {}
for i = 3, #ARGV, 3 do
  local id, due, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if mode == 'nx' then
    if redis.call('ZADD', KEYS[1], 'NX', due, id) == 1 then
      redis.call('HSET', KEYS[2], id, now .. ':' .. payload)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  else
    local added = redis.call('ZADD', KEYS[1], due, id)
    redis.call('HSET', KEYS[2], id, now .. ':' .. payload)
    if added == 1 then out[#out + 1] = 1 else out[#out + 1] = 2 end
  end
end
return out
