-- cancel.lua: remove one scheduled order (schedule entry and payload together).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- ARGV[1]  order id
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).

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

local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return removed
