-- stats.lua: one consistent snapshot of a shard's numbers.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's STREAM
-- KEYS[3]  the shard's dead-letter STREAM
-- ARGV[1]  now, unix ms
--
-- Returns: { scheduled, overdue, next_due_ms or false, stream_length, dead,
--            { {group, consumers, pending, lag or -1, idle_ms or -1}, ... } }
--   idle_ms: since any consumer of the group last read (the smallest consumer idle time),
--            -1 without consumers: an abandoned group shows a large or missing value.
local now = int(ARGV[1])
if not now then return redis.error_reply('ERR delayq stats: now must be unix milliseconds') end
local scheduled = redis.call('ZCARD', KEYS[1])
local overdue = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local stream_len, dead = 0, 0
local groups = {}
if redis.call('EXISTS', KEYS[2]) == 1 then
  stream_len = redis.call('XLEN', KEYS[2])
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local name, consumers, pending, lag = nil, 0, 0, -1
    for i = 1, #g, 2 do
      local k, v = g[i], g[i + 1]
      if k == 'name' then name = v
      elseif k == 'consumers' then consumers = v
      elseif k == 'pending' then pending = v
      elseif k == 'lag' and v then lag = v end
    end
    local idle = -1
    for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[2], name)) do
      for i = 1, #c, 2 do
        if c[i] == 'idle' and (idle < 0 or c[i + 1] < idle) then idle = c[i + 1] end
      end
    end
    groups[#groups + 1] = { name, consumers, pending, lag, idle }
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then dead = redis.call('XLEN', KEYS[3]) end
return { scheduled, overdue, head[2] or false, stream_len, dead, groups }
