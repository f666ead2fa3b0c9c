-- create_queue.lua: register a queue (idempotent), within the namespace's cap on queues.
--
-- KEYS[1]  the namespace's SET of queue names        ({ns}:queues)
-- KEYS[2]  the queue's registry record HASH           ({ns}:queue:<q>): shards, epoch, ...
-- KEYS[3]  the registry's version counter STRING      ({ns}:registry:version)
-- ARGV[1]  the queue name
-- ARGV[2]  shard count, 1..1024
-- ARGV[3]  a new epoch (an opaque token), used when the record has none
-- ARGV[4]  the most queues the namespace may have
--
-- Returns: { created, shards, epoch }
--   created = 1 when this call registered the queue, 0 when it existed, -1 when it is being
--             deleted (the record is marked "deleting" by retire.lua: nothing written; the
--             caller finishes that delete with the shards and epoch returned, then creates
--             the queue afresh, so a re-created queue starts empty);
--   shards  = the registered shard count (the caller refuses another one);
--   epoch   = the queue's epoch, which the caller writes into each shard's meta hash.
-- Error "ERR delayq too_many_queues ..." when the cap is reached (nothing written).
--
-- Why one script: the cap check, the record and the name set change together, so two
-- processes creating queues at once cannot pass the cap, and a record never lacks its
-- epoch. A record of an earlier version (no epoch) gets one here. Every change bumps the
-- version counter that supervisors watch. The caller writes the epoch into the shards'
-- meta hashes, then checks the record again (write, then check): a delete that began meanwhile
-- makes it undo those meta-hash writes. Cost: O(1). Redis >= 6.2.
-- @include int

-- int.lua: `int(s)`, the one check of an integer argument.
-- An include, not a script: a script that names it in its header (`-- @include int`)
-- gets it after its header (`engine::scripts::source`).

-- A canonical decimal integer within +-(2^53 - 1) (no spaces, exponents, hex, nan or inf,
-- nothing a double cannot hold exactly), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^-?[0-9]+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 or n < -9007199254740991 then return nil end
  return n
end

local shards = int(ARGV[2])
local max = int(ARGV[4])
if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR delayq create_queue: the queue name is missing')
end
if not shards or shards < 1 or shards > 1024 then
  return redis.error_reply('ERR delayq create_queue: shards must be 1..1024')
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq create_queue: the epoch is missing')
end
if not max or max < 1 then
  return redis.error_reply('ERR delayq create_queue: the cap on queues must be at least 1')
end

local stored = redis.call('HGET', KEYS[2], 'shards')
if stored and redis.call('HEXISTS', KEYS[2], 'deleting') == 1 then
  return { -1, tonumber(stored), redis.call('HGET', KEYS[2], 'epoch') or '' }
end
if stored then
  local epoch = redis.call('HGET', KEYS[2], 'epoch')
  if not epoch then
    epoch = ARGV[3]
    redis.call('HSET', KEYS[2], 'epoch', epoch)
    redis.call('INCR', KEYS[3])
  end
  if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then redis.call('INCR', KEYS[3]) end
  return { 0, tonumber(stored), epoch }
end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and redis.call('SCARD', KEYS[1]) >= max then
  return redis.error_reply('ERR delayq too_many_queues: the namespace has ' .. max .. ' queues')
end
redis.call('HSET', KEYS[2], 'shards', shards, 'epoch', ARGV[3])
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[3])
return { 1, shards, ARGV[3] }
