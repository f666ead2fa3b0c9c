-- replay.lua: redeliver dead letters to the group that failed them, and only to it.
--
-- KEYS[1]  the shard's dead-letter STREAM
-- KEYS[2]  the shard's STREAM
-- KEYS[3]  the shard's history bucket for "now" (see dequeue.lua)
-- KEYS[4], KEYS[5]  the shard's high and low lane STREAMs, KEYS[6] its meta HASH: a dead
--          letter with priority = high or low goes back into its level's lane
--          (opened with the normal stream's groups if needed, as dequeue.lua does)
-- ARGV[1]  group filter: only dead letters of this group ("" = any group)
-- ARGV[2]  when the history bucket expires, unix ms (0 = history off: KEYS[3] is untouched)
-- ARGV[3..] dead-letter entry ids
--
-- Each dead letter is appended to the stream as a new entry with its original fields plus
-- for_group = <its group> (every other group acknowledges it without running its handler),
-- then deleted from the dead-letter stream, and that group's history follows the new entry:
-- the field "\2<group>\2<order id>" -> "<new entry id>:<due ms>" in the bucket of now
-- redirects that group only; every other group keeps reporting the delivery it handled.
-- The new entry starts again at attempt 1 and keeps the order's priority level. A replay
-- that appended anything announces a group timer due now ("t0") on the shard's wake
-- channel (wake.lua), so pull receives waiting in any process read at once (workers'
-- blocking reads see the new entries by themselves; dispatchers ignore it).
-- Why one script: the append and the delete go together, so an interrupted replay loses
-- nothing and replays nothing twice. Cost: O(k) for k ids (XRANGE of one id, XADD, XDEL
-- and one HSET each), O(1) for the announce. Redis >= 6.2.
-- Returns: the number of entries replayed (ids not found or of another group are skipped).
-- @include int, lanes, wake
local hist_at = int(ARGV[2])
if not hist_at or hist_at < 0 then
  return redis.error_reply('ERR delayq replay: history expiry must be unix milliseconds or 0')
end
if #KEYS ~= 6 then
  return redis.error_reply('ERR delayq replay: 6 KEYS expected')
end
local lanes = { high = KEYS[4], low = KEYS[5] }
local n = 0
local hist = {}
for i = 3, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if e[1] then
    local f = e[1][2]
    local group, id, due, level
    for j = 1, #f, 2 do
      if f[j] == 'group' then group = f[j + 1]
      elseif f[j] == 'id' then id = f[j + 1]
      elseif f[j] == 'due_ms' then due = f[j + 1]
      elseif f[j] == 'priority' then level = f[j + 1] end
    end
    if group and (ARGV[1] == '' or ARGV[1] == group) then
      local out = {}
      for j = 1, #f, 2 do
        local k = f[j]
        if k == 'id' or k == 'due_ms' or k == 'data' or k == 'flag' or k == 'priority' then
          out[#out + 1] = k
          out[#out + 1] = f[j + 1]
        end
      end
      out[#out + 1] = 'for_group'
      out[#out + 1] = group
      local stream, suffix = KEYS[2], ''
      if lanes[level] then
        stream, suffix = lanes[level], ':' .. level
        open_lane(stream, KEYS[2], KEYS[6], 'lane:' .. level)
      end
      local eid = redis.call('XADD', stream, '*', unpack(out))
      redis.call('XDEL', KEYS[1], ARGV[i])
      n = n + 1
      if hist_at > 0 and id and due then
        hist[#hist + 1] = '\2' .. group .. '\2' .. id
        hist[#hist + 1] = eid .. ':' .. due .. suffix
      end
    end
  end
end
if #hist > 0 then
  redis.call('HSET', KEYS[3], unpack(hist))
  redis.call('PEXPIREAT', KEYS[3], hist_at)
end
if n > 0 then announce(KEYS[2], 't0') end
return n
