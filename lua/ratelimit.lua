-- ratelimit.lua: take up to n permits from a group's rate limit (GCRA), shared by every
-- process of the group.
--
-- KEYS[1]  the limiter's key ({ns}:rate:<queue>:<group>; a STRING holding the theoretical
--          arrival time, unix microseconds)
-- ARGV[1]  now, unix microseconds (the Redis clock, read by the caller)
-- ARGV[2]  emission interval: microseconds per permit (period / limit)
-- ARGV[3]  burst: permits that may be taken at once (>= 1)
-- ARGV[4]  n: permits wanted (1..1000), or given back
-- ARGV[5]  "take" (default) or "refund": give back n permits taken but not used (a read
--          that returned fewer entries than it took permits for), never below now
--
-- Returns: { granted, wait_us }  granted = permits taken (0..n); when 0, wait_us = how long
--          until the next one is free. A refund returns { n, 0 }.
--
-- Why a script: reading and advancing the arrival time must be one step, or two processes
-- would take the same permits. Permits for a whole read are taken in one call.
-- Cost: O(1). Redis >= 6.2.
-- @include int
local now, t, burst, n = int(ARGV[1]), int(ARGV[2]), int(ARGV[3]), int(ARGV[4])
if not now or not t or t < 1 or not burst or burst < 1 or not n or n < 1 or n > 1000 then
  return redis.error_reply('ERR delayq ratelimit: bad arguments')
end
local mode = ARGV[5] or 'take'
if mode ~= 'take' and mode ~= 'refund' then
  return redis.error_reply('ERR delayq ratelimit: mode must be take or refund')
end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if mode == 'refund' then
  if tat <= now then return { n, 0 } end
  tat = tat - n * t
  if tat < now then tat = now end
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  return { n, 0 }
end
if tat < now then tat = now end
local tau = (burst - 1) * t
-- Permits free now: those whose arrival time is within now + tau.
local free = math.floor((now + tau - tat) / t) + 1
if free < 1 then
  return { 0, tat - tau - now }
end
if free > n then free = n end
tat = tat + free * t
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return { free, 0 }
