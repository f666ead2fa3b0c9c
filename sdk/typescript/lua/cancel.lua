-- cancel.lua: remove one scheduled order (schedule entry, payload and level together).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  optional: the shard's levels HASH (see enqueue.lua)
-- ARGV[1]  order id
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).
-- Why one script: the three go together, so no crash leaves a payload or level without its
-- schedule entry. Redis >= 6.2.

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

-- The names of a stream's consumer groups (none when the stream does not exist).
local function group_names(stream)
  local names = {}
  if redis.call('EXISTS', stream) == 0 then return names end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    for i = 1, #g, 2 do
      if g[i] == 'name' then names[#names + 1] = g[i + 1] end
    end
  end
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

local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('HDEL', KEYS[3], ARGV[1]) end
return removed
