-- extend.lua: extend the leases a consumer still holds, by compare-and-set on each timer.
--
-- KEYS[1]  the group's timers ZSET for one shard (member = entry id, score = unix ms)
-- ARGV[1]  new lease end, unix ms (canonical decimal integer)
-- ARGV[2k], ARGV[2k+1]  (k >= 1) an entry id and the lease end this consumer last set for it
--
-- Returns: the ids whose lease was extended. An entry whose timer is gone (acknowledged),
-- or holds another score (a retry time set since, or a lease another consumer took after
-- this one's ran out) is left alone.
--
-- Why a script: each timer is checked and moved in one step, so an extension racing a
-- settlement (retry.lua, dead.lua, XACK + ZREM) can never overwrite its result. Without
-- it the worker would have to hold a lock across the Redis round trip.
-- Cost: O(k log T) for k entries in a timers ZSET of T. Redis >= 6.2 (ZADD XX; nothing
-- newer is used).
-- @include int
local until_ms = int(ARGV[1])
if not until_ms then return redis.error_reply('ERR delayq extend: bad lease end') end
if #ARGV % 2 ~= 1 then return redis.error_reply('ERR delayq extend: id/lease pairs expected') end
for i = 3, #ARGV, 2 do
  if not int(ARGV[i]) then return redis.error_reply('ERR delayq extend: bad lease value') end
end
local out = {}
for i = 2, #ARGV, 2 do
  local sc = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if sc and tonumber(sc) == int(ARGV[i + 1]) then
    redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
return out
