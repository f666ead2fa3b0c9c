-- schedule.lua: a recurring schedule's record and its place in the namespace's indexes.
--
-- KEYS[1]  the schedule's record HASH   ({ns}:schedule:<queue>:<id>): spec (JSON), gen,
--                                       epoch, cost, next, last, ticks, missed,
--                                       created_ms, updated_ms
-- KEYS[2]  the namespace's due index    ({ns}:schedules, ZSET): member "<queue>:<id>",
--                                       score = the schedule's next tick (unix ms)
-- KEYS[3]  the queue's registry record  ({ns}:queue:<queue>) (put)
-- KEYS[4]  the namespace's full index   ({ns}:schedules:all, ZSET): every schedule whatever
--                                       its state, member "<queue>:<id>", score 0
-- KEYS[5]  the namespace's totals HASH  ({ns}:schedules:totals): gen (the last generation
--                                       given), cost (the sum of every schedule's cost)
-- ARGV[1]  mode: "put", "advance" or "remove"
-- ARGV[2]  the index member, "<queue>:<id>"
-- put:     ARGV[3] spec JSON, ARGV[4] next tick (unix ms, or "" when it never ticks),
--          ARGV[5] now (unix ms), ARGV[6] the most schedules the namespace may have,
--          ARGV[7] this schedule's cost, ARGV[8] the most the costs may sum to
-- advance: ARGV[3] the generation the caller read, ARGV[4] the next tick it read,
--          ARGV[5] the new next tick (or "" when the schedule has ended), ARGV[6] the tick
--          that fired (or ""), ARGV[7] ticks fired, ARGV[8] ticks missed
-- remove:  ARGV[3] now (unix ms)
--
-- Numbers are canonical decimal integers (at most 2^53 - 1, not negative). Redis >= 6.2.
--
-- Generations come from the namespace's counter (KEYS[5] gen), at least now in
-- microseconds, so they only grow, also across a removal and a re-creation of the same id:
-- tick.lua compares them in each shard.
--
-- Returns: put: { previous next tick or "", generation, 2 = created, 1 = replaced, 0 = the
--          record already held this spec for this queue epoch (nothing written), the queue's epoch
--          ("" for a queue record without one) };
--          advance: 1 = advanced, 0 = the record changed meanwhile (another scheduler
--          advanced it, or it was updated or removed): nothing written;
--          remove: { the next tick it had ("" if none), the removal's generation }, or
--          false when there was no schedule.
-- Errors:  "ERR delayq queue_not_found ..." (put on a queue that is not registered),
--          "ERR delayq too_many_schedules ..." (put beyond the cap),
--          "ERR delayq schedule_budget: <sum of the other schedules' costs>" (put raising
--          the sum of costs over ARGV[8]), writing nothing.
--
-- Why one script: the record and the indexes change together (every schedule is in the
-- full index, and in the due index exactly when it has a next tick), an update takes a new
-- generation that a concurrent advance compares, and the queue's existence, the cap and the
-- cost budget are checked in the same step as the write.
-- Cost: O(log n) in the number of schedules (a few HASH fields, ZADD/ZREM on two indexes).
-- Every argument is checked before anything is written.
-- "" or a non-negative integer; false when neither.
-- @include int
local function opt(s)
  if s == '' then return nil end
  local n = int(s)
  if not n or n < 0 then return false end
  return n
end
-- The record's next tick and the due index move together: a schedule is in the due index
-- exactly when it has a next tick.
local function place(member, nxt)
  if nxt then
    redis.call('HSET', KEYS[1], 'next', nxt)
    redis.call('ZADD', KEYS[2], nxt, member)
  else
    redis.call('HDEL', KEYS[1], 'next')
    redis.call('ZREM', KEYS[2], member)
  end
end
-- A new generation: above the namespace's counter, the record's own (a record written
-- before the counter existed) and now in microseconds (so a counter rolled back, by a
-- failover or by hand, never gives a generation that shards have already fenced out).
local function next_gen(now)
  local g = redis.call('HINCRBY', KEYS[5], 'gen', 1)
  local own = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
  local floor = math.max(own + 1, now * 1000)
  if floor > g then
    g = floor
    redis.call('HSET', KEYS[5], 'gen', string.format('%d', g))
  end
  return g
end
local mode, member = ARGV[1], ARGV[2]
if type(member) ~= 'string' or not string.find(member, ':', 1, true) then
  return redis.error_reply('ERR delayq schedule: the member must be <queue>:<id>')
end

if mode == 'put' then
  local spec, nxt, now, max = ARGV[3], opt(ARGV[4]), int(ARGV[5]), int(ARGV[6])
  local cost, max_cost = int(ARGV[7]), int(ARGV[8])
  if type(spec) ~= 'string' or string.sub(spec, 1, 1) ~= '{' then
    return redis.error_reply('ERR delayq schedule: the spec must be a JSON object')
  end
  if nxt == false or not now or now < 0 or not max or max < 1 or not cost or cost < 0
    or not max_cost or max_cost < 0 then
    return redis.error_reply('ERR delayq schedule: next, now, max, cost and max cost must be unix ms / counts')
  end
  if redis.call('EXISTS', KEYS[3]) == 0 then
    return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
  end
  local epoch = redis.call('HGET', KEYS[3], 'epoch') or ''
  local exists = redis.call('EXISTS', KEYS[1]) == 1
  if exists and redis.call('HGET', KEYS[1], 'spec') == spec
    and (redis.call('HGET', KEYS[1], 'epoch') or '') == epoch then
    -- Declared again as it is (a restart reading its config): keep its next tick.
    redis.call('ZADD', KEYS[4], 'NX', 0, member)
    return { redis.call('HGET', KEYS[1], 'next') or '', tonumber(redis.call('HGET', KEYS[1], 'gen')), 0, epoch }
  end
  if not exists and redis.call('ZCARD', KEYS[4]) >= max then
    return redis.error_reply('ERR delayq too_many_schedules: the namespace has ' .. max .. ' schedules')
  end
  local total = tonumber(redis.call('HGET', KEYS[5], 'cost') or '0') or 0
  local old = tonumber(redis.call('HGET', KEYS[1], 'cost') or '0') or 0
  if cost > old and total - old + cost > max_cost then
    return redis.error_reply('ERR delayq schedule_budget: ' .. (total - old))
  end
  local previous = redis.call('HGET', KEYS[1], 'next') or ''
  local gen = next_gen(now)
  redis.call('HSET', KEYS[1], 'gen', string.format('%d', gen), 'spec', spec, 'updated_ms', now, 'epoch', epoch, 'cost', cost)
  redis.call('HSETNX', KEYS[1], 'created_ms', now)
  if cost ~= old then redis.call('HINCRBY', KEYS[5], 'cost', cost - old) end
  redis.call('ZADD', KEYS[4], 0, member)
  place(member, nxt)
  return { previous, gen, exists and 1 or 2, epoch }
elseif mode == 'advance' then
  local gen, expected, nxt, fired = int(ARGV[3]), int(ARGV[4]), opt(ARGV[5]), opt(ARGV[6])
  local ticks, missed = int(ARGV[7]), int(ARGV[8])
  if not gen or not expected or nxt == false or fired == false or not ticks or ticks < 0
    or not missed or missed < 0 then
    return redis.error_reply('ERR delayq schedule: advance takes gen, next, new next, fired, ticks, missed')
  end
  if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[3] or redis.call('HGET', KEYS[1], 'next') ~= ARGV[4] then
    return 0
  end
  if fired then redis.call('HSET', KEYS[1], 'last', fired) end
  if ticks > 0 then redis.call('HINCRBY', KEYS[1], 'ticks', ticks) end
  if missed > 0 then redis.call('HINCRBY', KEYS[1], 'missed', missed) end
  place(member, nxt)
  return 1
elseif mode == 'remove' then
  local now = int(ARGV[3])
  if not now or now < 0 then
    return redis.error_reply('ERR delayq schedule: remove takes now (unix ms)')
  end
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZREM', KEYS[4], member)
    return false
  end
  local previous = redis.call('HGET', KEYS[1], 'next') or ''
  local cost = tonumber(redis.call('HGET', KEYS[1], 'cost') or '0') or 0
  local gen = next_gen(now)
  if cost ~= 0 then redis.call('HINCRBY', KEYS[5], 'cost', -cost) end
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[4], member)
  return { previous, gen }
end
return redis.error_reply('ERR delayq schedule: mode must be put, advance or remove')
