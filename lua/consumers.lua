-- consumers.lua: delete consumers that are gone (idle, nothing pending), atomically.
--
-- KEYS[1]  the shard's STREAM
-- ARGV[1]  minimum idle time, ms
--
-- XGROUP DELCONSUMER discards a consumer's pending entries, so a consumer is deleted only if
-- it has none, checked in this same script: a consumer with pending entries is never
-- deleted before they are claimed by someone else.
-- Returns: the number of consumers deleted.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local min_idle = int(ARGV[1])
if not min_idle or min_idle < 0 then
  return redis.error_reply('ERR delayq consumers: minimum idle time must be a non-negative integer')
end
local n = 0
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local group
  for i = 1, #g, 2 do if g[i] == 'name' then group = g[i + 1] end end
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], group)) do
    local name, pending, idle
    for i = 1, #c, 2 do
      if c[i] == 'name' then name = c[i + 1]
      elseif c[i] == 'pending' then pending = c[i + 1]
      elseif c[i] == 'idle' then idle = c[i + 1] end
    end
    if pending == 0 and idle >= min_idle then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, name)
      n = n + 1
    end
  end
end
return n
