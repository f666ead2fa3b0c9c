-- fence.lua: the first step of deleting a queue, one shard at a time: check that the shard
-- holds nothing (unless forced), then remove its epoch so no producer can write into it.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's STREAM
-- KEYS[3]  the shard's dead-letter STREAM
-- KEYS[4]  the shard's meta HASH (field epoch)
-- KEYS[5], KEYS[6]  the shard's high and low lane STREAMs (a group's pending and lag are
--          summed over the lanes)
-- ARGV[1]  the epoch the caller read from the registry record
-- ARGV[2]  "1" = forced (fence even when not empty), "0" = refuse when not empty
--
-- Returns: { fenced, scheduled, dead, group, pending, lag, group, pending, lag, ... }
--   fenced    = 1 when the epoch was removed or the shard had none (a delete cut off and
--               resumed, or a create whose meta hashes are not written yet: the caller then
--               purges the shard's keys), 0 when it was refused (not empty, nothing
--               written), -1 when the shard has another epoch (deleted and created again:
--               left alone);
--   scheduled = orders in the due ZSET; dead = dead letters;
--   per group = its name, entries pending in it (taken, not settled) and its lag (stream
--               entries it has not read yet: a paused group, a rate limit or a slow
--               handler leaves them; the stream is walked when XINFO cannot tell).
--
-- Why one script: the emptiness check and the fence happen together, so no order can slip
-- in between "found empty" and "fenced": once fenced, enqueue.lua refuses the shard.
-- Cost: O(groups), plus a walk of up to 100,000 entries per group when XINFO cannot tell
-- a lag (entries deleted from the middle of a stream). Redis >= 7.0 (XINFO GROUPS reports
-- entries-read and lag).
-- @include groups
if #KEYS ~= 6 then return redis.error_reply('ERR delayq fence: 6 KEYS expected') end
if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR delayq fence: the epoch is missing')
end
if ARGV[2] ~= '0' and ARGV[2] ~= '1' then
  return redis.error_reply('ERR delayq fence: force must be 0 or 1')
end
local held = redis.call('HGET', KEYS[4], 'epoch')
if held and held ~= ARGV[1] then
  return { -1, 0, 0 }
end
local scheduled = redis.call('ZCARD', KEYS[1])
local dead = redis.call('XLEN', KEYS[3])
local out = { 0, scheduled, dead }
local busy = scheduled > 0 or dead > 0
local names, per = {}, {}
for _, stream in ipairs({ KEYS[2], KEYS[5], KEYS[6] }) do
  for _, info in ipairs(groups_of(stream)) do
    local lag = info['lag']
    if type(lag) ~= 'number' then
      -- Unknown (entries deleted from the middle of the stream): count what follows the
      -- group's last-delivered id, up to 100,000 (enough to say "not empty").
      lag = #redis.call('XRANGE', stream, '(' .. info['last-delivered-id'], '+', 'COUNT', 100000)
    end
    local name = info['name']
    if not per[name] then
      per[name] = { 0, 0 }
      names[#names + 1] = name
    end
    per[name][1] = per[name][1] + (info['pending'] or 0)
    per[name][2] = per[name][2] + lag
  end
end
for _, name in ipairs(names) do
  out[#out + 1] = name
  out[#out + 1] = per[name][1]
  out[#out + 1] = per[name][2]
  if per[name][1] > 0 or per[name][2] > 0 then busy = true end
end
if busy and ARGV[2] == '0' then
  return out
end
if held then redis.call('HDEL', KEYS[4], 'epoch') end
out[1] = 1
return out
