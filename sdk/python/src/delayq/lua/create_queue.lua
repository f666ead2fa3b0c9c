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
--   epoch   = the queue's epoch, which the caller writes into each shard's marker.
-- Error "ERR delayq too_many_queues ..." when the cap is reached (nothing written).
--
-- Why one script: the cap check, the record and the name set change together, so two
-- processes creating queues at once cannot pass the cap, and a record never lacks its
-- epoch. A record of an earlier version (no epoch) gets one here. Every change bumps the
-- version counter that supervisors watch. The caller writes the epoch into the shards'
-- markers, then checks the record again (write, then check): a delete that began meanwhile
-- makes it undo those markers. Cost: O(1). Redis >= 6.2.

-- prelude.lua: helpers every script may use. Not a script of its own: the engine puts it
-- into each script's text right after that script's header (the SHA1 covers the whole
-- text), so every script runs with these definitions and each file keeps only its own
-- logic. `delayq scripts export` writes the scripts whole, as Redis runs them.

-- A canonical decimal integer within +-(2^53 - 1) (no spaces, exponents, hex, nan or inf,
-- nothing a double cannot hold exactly), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^-?[0-9]+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 or n < -9007199254740991 then return nil end
  return n
end

-- Cross-process wake-ups. `earliest(due)` is a shard's earliest due time (nil: none). After
-- a write that scheduled orders, the earliest of them due at `due_ms`, `wake(due, before,
-- due_ms)` publishes `due_ms` on the shard's wake channel (its due key with `wake` for
-- `due`: `{tag}:wake`) when it is earlier than the shard's earliest before the write:
-- every dispatcher of the queue listens there and looks at the shard then. Sharded
-- (`SPUBLISH`, Redis 7) where the server has it, `PUBLISH` on 6.2. Cost: O(1) + one
-- `ZRANGE 0 0`, O(log n), per call.
local function earliest(due)
  local f = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  return tonumber(f[2])
end
local function wake(due, before, due_ms)
  if due_ms and (not before or due_ms < before) then
    local channel = string.sub(due, 1, -4) .. 'wake'
    -- A refused publish (no SPUBLISH on 6.2; an ACL without the channel) never fails the
    -- write: the dispatchers' fallback poll finds the order.
    local r = redis.pcall('SPUBLISH', channel, due_ms)
    if type(r) == 'table' and r.err then redis.pcall('PUBLISH', channel, due_ms) end
  end
end

-- Tags (issue 43, src/engine/tags.rs). `tag_list(v)`: the tag list of a stored value or
-- payload argument, the text between its first two GS ("t1\31t2"), or false when it has
-- none (a raw GS only ever opens the list: ids, keys and tags forbid control characters and
-- a JSON text holds none). `each_tag(list, id, set, v)`: set[<tag>\31<id>] = v for each tag.
local function tag_list(v)
  if type(v) ~= 'string' then return false end
  local a = string.find(v, '\29', 1, true)
  if not a then return false end
  local b = string.find(v, '\29', a + 1, true)
  if not b or b == a + 1 then return false end
  return string.sub(v, a + 1, b - 1)
end
local function each_tag(list, id, set, v)
  for t in string.gmatch(list, '[^\31]+') do set[t .. '\31' .. id] = v end
end

-- A stream id's two parts ("<ms>-<seq>") as numbers.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

-- Whether stream id a comes before stream id b.
local function id_less(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  return am < bm or (am == bm and as < bs)
end

-- An XINFO reply's flat list of fields and values as a table (a nil value reads as false).
local function info_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The consumer groups of a stream, each as a table of its XINFO GROUPS fields (name,
-- consumers, pending, last-delivered-id; entries-read and lag from Redis 7.0); none when
-- the stream does not exist.
local function groups_of(stream)
  local out = {}
  if redis.call('EXISTS', stream) == 0 then return out end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do out[#out + 1] = info_table(g) end
  return out
end

-- The consumers of one group of a stream, each as a table of its XINFO CONSUMERS fields
-- (name, pending, idle).
local function consumers_of(stream, group)
  local out = {}
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
    out[#out + 1] = info_table(c)
  end
  return out
end

-- The names of a stream's consumer groups (none when the stream does not exist).
local function group_names(stream)
  local names = {}
  for _, g in ipairs(groups_of(stream)) do names[#names + 1] = g['name'] end
  return names
end

-- Opens a priority lane of a shard, once: makes its stream with every consumer group the
-- shard's normal stream has (each reading from the start of the lane) and sets the lane's
-- marker field in the shard's marker HASH, from which readers learn that it is in use.
local function open_lane(lane, normal, meta, marker)
  if redis.call('EXISTS', lane) == 1 then return end
  for _, g in ipairs(group_names(normal)) do
    redis.call('XGROUP', 'CREATE', lane, g, '0', 'MKSTREAM')
  end
  redis.call('HSET', meta, marker, '1')
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
