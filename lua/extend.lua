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
-- Cost: O(k log T) for k entries in a timers ZSET of T, in two calls per 1,000 pairs (one
-- ZMSCORE, one ZADD XX of the moved ones), not two per entry. Pairs are settled in order: a
-- pair naming an entry an earlier pair of this call moved compares with the new end, as a
-- ZSCORE after that ZADD would. Redis >= 6.2 (ZMSCORE, ZADD XX; nothing newer is used).
-- @include int
local until_ms = int(ARGV[1])
if not until_ms then return redis.error_reply('ERR delayq extend: bad lease end') end
if #ARGV % 2 ~= 1 then return redis.error_reply('ERR delayq extend: id/lease pairs expected') end
for i = 3, #ARGV, 2 do
  if not int(ARGV[i]) then return redis.error_reply('ERR delayq extend: bad lease value') end
end
local out = {}
-- An entry's score as this call left it: read with ZMSCORE, set to until_ms when moved.
local now = {}
for s = 2, #ARGV, 2000 do
  local last = math.min(s + 1998, #ARGV - 1)
  local ids = {}
  for i = s, last, 2 do
    if now[ARGV[i]] == nil then ids[#ids + 1] = ARGV[i] end
  end
  if #ids > 0 then
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids))
    for k = 1, #ids do now[ids[k]] = scores[k] and tonumber(scores[k]) or false end
  end
  local moved = {}
  for i = s, last, 2 do
    local id = ARGV[i]
    if now[id] and now[id] == int(ARGV[i + 1]) then
      now[id] = until_ms
      moved[#moved + 1] = until_ms
      moved[#moved + 1] = id
      out[#out + 1] = id
    end
  end
  if #moved > 0 then redis.call('ZADD', KEYS[1], 'XX', unpack(moved)) end
end
return out
