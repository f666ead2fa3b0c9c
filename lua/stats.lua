#!lua flags=no-writes
-- stats.lua: one consistent snapshot of a shard's numbers.
--
-- Flags: no-writes (the first line): Redis 7.0+ runs it on read-only replicas and under
-- maxmemory, and refuses any write in it; older servers get the text without that line.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's STREAM
-- KEYS[3]  the shard's dead-letter STREAM
-- KEYS[4], KEYS[5]  the shard's high and low lane STREAMs
-- ARGV[1]  now, unix ms
--
-- Returns: { scheduled, overdue, next_due_ms or false, stream_length, dead,
--            { {group, consumers, pending, lag or -1, idle_ms or -1}, ... },
--            { {length, pending, unread} of the normal, high and low lanes } }
--   A group's numbers are summed over the lanes (consumers: the most of any lane; idle:
--   the least); stream_length over the lanes too. unread: entries no group has read yet,
--   summed over the groups (what waits at that level).
--   idle_ms: since any consumer of the group last read (the smallest consumer idle time),
--            -1 without consumers: an abandoned group shows a large or missing value.
-- Cost: O(log N) in the scheduled orders (ZCARD, ZCOUNT, ZRANGE 0 0) plus, per lane,
-- O(groups + consumers) (XINFO GROUPS, XINFO CONSUMERS). Redis >= 6.2 (lag needs 7.0;
-- older servers report -1).
-- @include int, groups
if #KEYS ~= 5 then return redis.error_reply('ERR delayq stats: 5 KEYS expected') end
local now = int(ARGV[1])
if not now then return redis.error_reply('ERR delayq stats: now must be unix milliseconds') end
local scheduled = redis.call('ZCARD', KEYS[1])
local overdue = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local stream_len, dead = 0, 0
local names, per = {}, {}
local lanes = {}
for li, stream in ipairs({ KEYS[2], KEYS[4], KEYS[5] }) do
  local len, pend, unread = 0, 0, 0
  if stream and redis.call('EXISTS', stream) == 1 then
    len = redis.call('XLEN', stream)
    for _, g in ipairs(groups_of(stream)) do
      local name, consumers, pending = g['name'], g['consumers'] or 0, g['pending'] or 0
      local lag = g['lag'] or -1
      local idle = -1
      for _, c in ipairs(consumers_of(stream, name)) do
        if c['idle'] and (idle < 0 or c['idle'] < idle) then idle = c['idle'] end
      end
      local e = per[name]
      if not e then
        e = { name, 0, 0, 0, -1 }
        per[name] = e
        names[#names + 1] = name
      end
      if consumers > e[2] then e[2] = consumers end
      e[3] = e[3] + pending
      if lag < 0 or e[4] < 0 then e[4] = -1 else e[4] = e[4] + lag end
      if idle >= 0 and (e[5] < 0 or idle < e[5]) then e[5] = idle end
      pend = pend + pending
      if lag > 0 then unread = unread + lag end
    end
  end
  stream_len = stream_len + len
  lanes[li] = { len, pend, unread }
end
local groups = {}
for _, name in ipairs(names) do groups[#groups + 1] = per[name] end
if redis.call('EXISTS', KEYS[3]) == 1 then dead = redis.call('XLEN', KEYS[3]) end
return { scheduled, overdue, head[2] or false, stream_len, dead, groups, lanes }
