-- tick.lua: enqueue one tick of a recurring schedule at most once, take a pending one back,
-- or bring a shard up to date with a change of the schedule.
--
-- KEYS[1]  the shard's due ZSET      member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH  field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's meta HASH   field epoch = the queue's epoch while it exists
-- KEYS[4]  the shard's ticks HASH    field = schedule id, value = "<latest>:<fence>": the
--                                    latest tick instant (unix ms) of that schedule
--                                    enqueued in this shard, and the oldest generation of
--                                    the schedule allowed to enqueue here (a value of an
--                                    earlier version, "<latest>", has fence 0)
-- KEYS[5]  the shard's tombstone     ({tag}:ticks:gone:<schedule id>, expiring STRING): the
--                                    generation at which the schedule was removed
-- ARGV[1]  mode: "fire" (enqueue the tick unless it, or a later tick of the schedule, was
--          enqueued in this shard, or the caller's generation is superseded), "unfire" (take
--          the tick back if it is still scheduled, so the schedule may enqueue a tick at
--          that instant again) or "sync" (the schedule changed: fence out older generations
--          and take their pending tick back)
-- ARGV[2]  now: unix ms (the Redis server clock, read by the caller)
-- ARGV[3]  the queue's epoch the schedule was declared on (fire)
-- ARGV[4]  the schedule id
-- ARGV[5]  the generation of the schedule the caller read (fire, unfire) or wrote (sync)
-- fire:    ARGV[6] the tick instant (unix ms), ARGV[7] the tick's order id
--          ("<schedule id>@<tick instant>"), ARGV[8] its due time (the instant, or now for
--          a catch-up tick), ARGV[9] the payload JSON, ARGV[10] not after (unix ms or "":
--          when now is later the tick is too late and is not enqueued), ARGV[11] when the
--          caller read the schedule (unix ms), ARGV[12] the oldest such reading accepted
--          (ms before now: an older one is superseded, as tombstones expire)
-- unfire:  ARGV[6] the tick instant, ARGV[7] the tick's order id
-- sync:    ARGV[6] "change" (take back a pending tick that is not due yet), "stop" (paused
--          or ended: take back the pending tick, due or not) or "remove" (as stop, then drop
--          the schedule's field and leave a tombstone), ARGV[7] the tombstone's life (ms)
--
-- Numbers are canonical decimal integers (at most 2^53 - 1, not negative). Redis >= 6.2.
--
-- Returns: fire: 1 = enqueued, 0 = already enqueued (this tick or a later one), 2 = too
--          late (not enqueued), 3 = superseded (the schedule changed or was removed since
--          the caller read it: not enqueued); unfire: 1 = taken back, 0 = not scheduled
--          (dispatched, or never enqueued), 3 = superseded; sync: 1 = a pending tick was
--          taken back, 0 = none, 3 = this shard already knows a newer generation.
-- Errors:  "ERR delayq queue_not_found ..." / "ERR delayq stale_epoch ..." as enqueue.lua
--          (fire), writing nothing.
--
-- Why one script: the check of the schedule's generation against the shard's fence and
-- tombstone, the check of its latest tick, the order and the new latest tick change
-- together, so any number of schedulers (processes that crash and restart) enqueue each
-- tick at most once, and none enqueues a tick for a version of the schedule that an update,
-- a pause or a removal has already fenced out of this shard: once every shard is synced
-- (before the API answers), the old version can never fire.
-- Cost: O(log n) in the shard's scheduled orders (HGET, GET, ZSCORE, ZADD or ZREM; a fired
-- tick due before the shard's earliest order is published on its wake channel, include
-- `wake`).
-- Every argument is checked before anything is written.
-- @include int, wake
local mode = ARGV[1]
if mode ~= 'fire' and mode ~= 'unfire' and mode ~= 'sync' then
  return redis.error_reply('ERR delayq tick: mode must be fire, unfire or sync')
end
local now = int(ARGV[2])
if not now or now < 0 then
  return redis.error_reply('ERR delayq tick: now must be unix milliseconds')
end
local sid = ARGV[4]
if type(sid) ~= 'string' or sid == '' then
  return redis.error_reply('ERR delayq tick: empty schedule id')
end
local gen = int(ARGV[5])
if not gen or gen < 0 then
  return redis.error_reply('ERR delayq tick: the generation must be a count')
end
-- The shard's state for the schedule: latest instant enqueued (or nil), fence.
local function state()
  local v = redis.call('HGET', KEYS[4], sid)
  if not v then return nil, 0 end
  local l, f = string.match(v, '^(%d+):(%d+)$')
  if l then return tonumber(l), tonumber(f) end
  return int(v), 0
end
local latest, fence = state()
local tomb = int(redis.call('GET', KEYS[5]) or '')
local superseded = gen < fence or (tomb ~= nil and gen <= tomb)
local function store(l, f)
  redis.call('HSET', KEYS[4], sid, string.format('%d:%d', l or 0, f))
end
-- Takes order `id` back if it is still scheduled; true when it was.
local function take_back(id)
  if not redis.call('ZSCORE', KEYS[1], id) then return false end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return true
end

if mode == 'sync' then
  local kind, ttl = ARGV[6], int(ARGV[7])
  if kind ~= 'change' and kind ~= 'stop' and kind ~= 'remove' then
    return redis.error_reply('ERR delayq tick: sync is change, stop or remove')
  end
  if not ttl or ttl < 1 then
    return redis.error_reply('ERR delayq tick: the tombstone life must be ms')
  end
  if fence >= gen or (tomb ~= nil and tomb >= gen) then return 3 end
  local taken = 0
  if latest and (kind ~= 'change' or latest > now) and take_back(sid .. '@' .. latest) then
    taken = 1
    -- Instants up to now stay fired; a later tick (at this instant too) may be enqueued again.
    if latest > now then latest = now end
  end
  if kind == 'remove' then
    redis.call('HDEL', KEYS[4], sid)
    redis.call('SET', KEYS[5], gen, 'PX', ttl)
  else
    store(latest, gen)
  end
  return taken
end

local tick = int(ARGV[6])
if not tick or tick < 0 then
  return redis.error_reply('ERR delayq tick: the tick instant must be unix milliseconds')
end
local id = ARGV[7]
if type(id) ~= 'string' or id == '' then
  return redis.error_reply('ERR delayq tick: empty order id')
end

if mode == 'unfire' then
  if superseded then return 3 end
  if not take_back(id) then return 0 end
  if latest and latest > now then store(now, fence) end
  return 1
end

local due = int(ARGV[8])
if not due or due < 0 then
  return redis.error_reply('ERR delayq tick: due_ms must be unix milliseconds')
end
if type(ARGV[9]) ~= 'string' or ARGV[9] == '' then
  return redis.error_reply('ERR delayq tick: empty payload')
end
local not_after = nil
if ARGV[10] ~= '' then
  not_after = int(ARGV[10])
  if not not_after then
    return redis.error_reply('ERR delayq tick: not_after must be unix milliseconds or empty')
  end
end
local read_ms, max_age = int(ARGV[11]), int(ARGV[12])
if not read_ms or not max_age or max_age < 0 then
  return redis.error_reply('ERR delayq tick: the reading time and its oldest age must be ms')
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq tick: the queue epoch is missing')
end
if superseded or now - read_ms > max_age then return 3 end
if latest and latest >= tick then return 0 end
if not_after and now > not_after then return 2 end
local epoch = redis.call('HGET', KEYS[3], 'epoch')
if not epoch then
  return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
end
if epoch ~= ARGV[3] then
  return redis.error_reply('ERR delayq stale_epoch: the queue was deleted and created again')
end
local before = earliest(KEYS[1])
redis.call('ZADD', KEYS[1], due, id)
wake(KEYS[1], before, due)
redis.call('HSET', KEYS[2], id, ARGV[2] .. ':' .. ARGV[9])
store(tick, fence)
return 1
