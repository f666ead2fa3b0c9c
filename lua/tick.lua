-- tick.lua: enqueue one tick of a recurring schedule at most once, or take a pending one back.
--
-- KEYS[1]  the shard's due ZSET      member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH  field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's marker HASH   field epoch = the queue's epoch while it exists
-- KEYS[4]  the shard's ticks HASH    field = schedule id, value = the latest tick instant
--                                    (unix ms) of that schedule enqueued in this shard
-- ARGV[1]  mode: "fire" (enqueue the tick unless it, or a later tick of the schedule, was
--          enqueued in this shard), "unfire" (take the tick back if it is still scheduled,
--          so the schedule may enqueue a tick at that instant again) or "forget" (drop the
--          schedule's field: the schedule was removed)
-- ARGV[2]  now: unix ms (the Redis server clock, read by the caller)
-- ARGV[3]  the queue's epoch as the caller read it from the registry record (fire)
-- ARGV[4]  the schedule id
-- ARGV[5]  the tick instant, unix ms (fire, unfire)
-- ARGV[6]  the tick's order id, "<schedule id>@<tick instant>" (fire, unfire)
-- ARGV[7]  the tick's due time, unix ms (fire: the instant, or now for a catch-up tick)
-- ARGV[8]  the payload JSON (fire)
-- ARGV[9]  not after: unix ms, or "" (fire: when now is later, the tick is too late and
--          is not enqueued)
--
-- Numbers are canonical decimal integers (at most 2^53 - 1, not negative). Redis >= 6.2.
--
-- Returns: fire: 1 = enqueued, 0 = already enqueued (this tick or a later one), 2 = too
--          late (not enqueued); unfire: 1 = taken back, 0 = not scheduled (dispatched, or
--          never enqueued); forget: 1.
-- Errors:  "ERR delayq queue_not_found ..." / "ERR delayq stale_epoch ..." as enqueue.lua
--          (fire), writing nothing.
--
-- Why one script: the check of the schedule's latest tick, the order and the new latest
-- tick change together, so any number of schedulers (processes that crash and restart)
-- enqueue each tick at most once: a second fire of the same instant finds it recorded.
-- Every argument is checked before anything is written.
local mode = ARGV[1]
if mode ~= 'fire' and mode ~= 'unfire' and mode ~= 'forget' then
  return redis.error_reply('ERR delayq tick: mode must be fire, unfire or forget')
end
local now = int(ARGV[2])
if not now or now < 0 then
  return redis.error_reply('ERR delayq tick: now must be unix milliseconds')
end
local sid = ARGV[4]
if type(sid) ~= 'string' or sid == '' then
  return redis.error_reply('ERR delayq tick: empty schedule id')
end
if mode == 'forget' then
  redis.call('HDEL', KEYS[4], sid)
  return 1
end
local tick = int(ARGV[5])
if not tick or tick < 0 then
  return redis.error_reply('ERR delayq tick: the tick instant must be unix milliseconds')
end
local id = ARGV[6]
if type(id) ~= 'string' or id == '' then
  return redis.error_reply('ERR delayq tick: empty order id')
end
local latest = int(redis.call('HGET', KEYS[4], sid) or '')

if mode == 'unfire' then
  if not redis.call('ZSCORE', KEYS[1], id) then return 0 end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  -- Instants up to now stay fired; a later tick (at this instant too) may be enqueued again.
  if latest and latest > now then redis.call('HSET', KEYS[4], sid, now) end
  return 1
end

local due = int(ARGV[7])
if not due or due < 0 then
  return redis.error_reply('ERR delayq tick: due_ms must be unix milliseconds')
end
if type(ARGV[8]) ~= 'string' or ARGV[8] == '' then
  return redis.error_reply('ERR delayq tick: empty payload')
end
local not_after = nil
if ARGV[9] ~= '' then
  not_after = int(ARGV[9])
  if not not_after then
    return redis.error_reply('ERR delayq tick: not_after must be unix milliseconds or empty')
  end
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq tick: the queue epoch is missing')
end
if latest and latest >= tick then return 0 end
if not_after and now > not_after then return 2 end
local epoch = redis.call('HGET', KEYS[3], 'epoch')
if not epoch then
  return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
end
if epoch ~= ARGV[3] then
  return redis.error_reply('ERR delayq stale_epoch: the queue was deleted and created again')
end
redis.call('ZADD', KEYS[1], due, id)
redis.call('HSET', KEYS[2], id, ARGV[2] .. ':' .. ARGV[8])
redis.call('HSET', KEYS[4], sid, tick)
return 1
