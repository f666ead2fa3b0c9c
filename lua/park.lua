-- park.lua: park entries that wait for a slot of their order key, and wake them.
--
-- KEYS[1]  the group's timers ZSET for one lane (member = entry id, score = unix ms)
-- KEYS[2]  the group's errors HASH for that lane; field "p:<entry id>" = the time the entry
--          is parked until, while it is parked
-- ARGV[1]  mode: park | unpark
-- ARGV[2]  park: parked until, unix ms; unpark: now, unix ms
-- ARGV[3..] park: (entry id, lease end this consumer last set) pairs; unpark: entry ids
--
-- Returns: the ids parked (park: where the timer still held that lease) or woken (unpark:
-- where the entry is still parked, its timer still at the parked time).
--
-- A parked entry stays in its consumer's pending list with its timer at the parked time, so
-- it is never lost: a key_slots.lua release wakes it (its timer moves to now, and a reclaim
-- takes it), or its timer comes due on its own. reclaim.lua claims an entry with a "p:"
-- field without counting a delivery (XCLAIM RETRYCOUNT), so waiting for a key slot is
-- never an attempt.
-- Why a script: each timer is checked and moved with its field in one step, so a park or a
-- wake racing a settlement or a reclaim can never revive or delay another owner's entry.
-- Cost: O(k log T) for k entries in a timers ZSET of T. Redis >= 6.2.
-- @include int
local at = int(ARGV[2])
if not at then return redis.error_reply('ERR delayq park: time must be unix milliseconds') end
local out = {}
if ARGV[1] == 'park' then
  if #ARGV % 2 ~= 0 then return redis.error_reply('ERR delayq park: id/lease pairs expected') end
  for i = 4, #ARGV, 2 do
    if not int(ARGV[i]) then return redis.error_reply('ERR delayq park: bad lease value') end
  end
  for i = 3, #ARGV, 2 do
    local sc = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if sc and tonumber(sc) == int(ARGV[i + 1]) then
      redis.call('ZADD', KEYS[1], 'XX', at, ARGV[i])
      redis.call('HSET', KEYS[2], 'p:' .. ARGV[i], at)
      out[#out + 1] = ARGV[i]
    end
  end
elseif ARGV[1] == 'unpark' then
  for i = 3, #ARGV do
    local p = redis.call('HGET', KEYS[2], 'p:' .. ARGV[i])
    local sc = p and redis.call('ZSCORE', KEYS[1], ARGV[i])
    if sc and tonumber(sc) == tonumber(p) then
      redis.call('ZADD', KEYS[1], 'XX', at, ARGV[i])
      out[#out + 1] = ARGV[i]
    end
  end
else
  return redis.error_reply('ERR delayq park: unknown mode')
end
return out
