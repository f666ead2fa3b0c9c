-- consumers.lua: delete consumers that are gone (idle, nothing pending), atomically.
--
-- KEYS[1]  the shard's STREAM
-- ARGV[1]  minimum idle time, ms
--
-- XGROUP DELCONSUMER discards a consumer's pending entries, so a consumer is deleted only if
-- it has none, checked in this same script: a consumer with pending entries is never
-- deleted before they are claimed by someone else.
-- Returns: the number of consumers deleted.
-- Cost: O(groups + consumers) (XINFO GROUPS, XINFO CONSUMERS per group), plus one
-- XGROUP DELCONSUMER per consumer deleted. Redis >= 6.2.
-- @include int, groups
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local min_idle = int(ARGV[1])
if not min_idle or min_idle < 0 then
  return redis.error_reply('ERR delayq consumers: minimum idle time must be a non-negative integer')
end
local n = 0
for _, g in ipairs(groups_of(KEYS[1])) do
  local group = g['name']
  for _, c in ipairs(consumers_of(KEYS[1], group)) do
    if c['pending'] == 0 and c['idle'] >= min_idle then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, c['name'])
      n = n + 1
    end
  end
end
return n
