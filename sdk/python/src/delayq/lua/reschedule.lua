-- reschedule.lua: move a scheduled order to a new due time, keeping its payload.
--
-- KEYS[1]  the shard's due ZSET
-- ARGV[1]  order id
-- ARGV[2]  new due time, unix ms
--
-- Returns: 1 = rescheduled, 0 = not found (never scheduled, or already dispatched).

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

local due = int(ARGV[2])
if not due or due < 0 then
  return redis.error_reply('ERR delayq reschedule: due_ms is not a number')
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
  return 1
end
return 0
