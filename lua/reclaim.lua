-- reclaim.lua: claim entries whose timer is due (a dead consumer's lease ran out, or a retry's
-- backoff elapsed) for this consumer, and lease them again.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard (see read.lua)
-- KEYS[3]  the group's errors HASH for this shard (see retry.lua)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  now, unix ms
-- ARGV[4]  lease end, unix ms (now + visibility timeout)
-- ARGV[5]  limit, 1..1000
-- ARGV[6..] the entry ids of this shard that this consumer still holds (its copy runs or
--           waits for a slot in this process)
--
-- Returns: { claimed, next_timer_ms, missing, kept }
--   claimed = { {entry_id, [field, value, ...], delivery_count}, ... } (delivery_count after
--             the claim: XCLAIM adds one, so it counts this delivery)
--   next_timer_ms = the earliest remaining timer (nil when none)
--   missing = { {entry_id, owner, delivery_count}, ... }: entries still pending whose stream
--             entry was deleted. They are not claimed (XCLAIM would silently drop them from
--             the pending list on Redis 7, and Redis 6.2 returns nil): they stay pending,
--             leased, and the caller dead-letters them (dead.lua, as their owner) with the
--             reason entry_missing. Nothing leaves the pending list unrecorded.
--   kept = { entry_id, ... }: due entries this consumer still holds (its lease extension
--          failed for a while). They are leased again but not claimed: XCLAIM would count a
--          delivery that never happened, so their retry would arrive one attempt late and
--          max_attempts would dead-letter them one attempt early.
--   An entry parked for a slot of its order key (its errors field "p:<id>", park.lua) is
--   claimed with its delivery count as it was (XCLAIM RETRYCOUNT): waiting is no attempt.
-- Cost: O(log n) per due entry (ZRANGE BYSCORE LIMIT, XPENDING and XRANGE by id, HDEL,
-- XCLAIM).
-- Timers (and error records) of entries that are no longer pending (acknowledged) are
-- dropped.
-- Why one script: the claim, the delivery count and the new lease go together, so a claimed
-- entry always has a timer. Redis >= 6.2.
-- @include int
if not int(ARGV[3]) or not int(ARGV[4]) then
  return redis.error_reply('ERR delayq reclaim: now and lease end must be unix milliseconds')
end
local limit = int(ARGV[5])
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR delayq reclaim: limit must be 1..1000')
end
local due = redis.call('ZRANGE', KEYS[2], '-inf', ARGV[3], 'BYSCORE', 'LIMIT', 0, limit)
local out, missing, kept = {}, {}, {}
if #due > 0 then
  local held = {}
  for i = 6, #ARGV do held[ARGV[i]] = true end
  local claim, lease, gone = {}, {}, {}
  for _, id in ipairs(due) do
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
    if not p[1] then
      gone[#gone + 1] = id
    elseif held[id] and p[1][2] == ARGV[2] then
      kept[#kept + 1] = id
      lease[#lease + 1] = ARGV[4]
      lease[#lease + 1] = id
    elseif not redis.call('XRANGE', KEYS[1], id, id)[1] then
      missing[#missing + 1] = { id, p[1][2], p[1][4] }
      lease[#lease + 1] = ARGV[4]
      lease[#lease + 1] = id
    elseif redis.call('HDEL', KEYS[3], 'p:' .. id) == 1 then
      -- Parked for a key slot (park.lua): claimed without counting a delivery.
      local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id,
        'RETRYCOUNT', p[1][4])
      if claimed[1] and claimed[1][2] then
        out[#out + 1] = { id, claimed[1][2], p[1][4] }
        lease[#lease + 1] = ARGV[4]
        lease[#lease + 1] = id
      end
    else
      claim[#claim + 1] = id
    end
  end
  if #claim > 0 then
    local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(claim))
    for _, e in ipairs(claimed) do
      if e and e[2] then
        local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
        local n = 1
        if p[1] then n = p[1][4] end
        out[#out + 1] = { e[1], e[2], n }
        lease[#lease + 1] = ARGV[4]
        lease[#lease + 1] = e[1]
      end
    end
  end
  if #lease > 0 then redis.call('ZADD', KEYS[2], unpack(lease)) end
  if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('HDEL', KEYS[3], unpack(gone))
    for _, id in ipairs(gone) do redis.call('HDEL', KEYS[3], 'p:' .. id) end
  end
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return { out, head[2] or false, missing, kept }
