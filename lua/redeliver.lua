-- redeliver.lua: send orders straight to one consumer group, unless they are still on
-- their way: the reconciliation job's delivery (nothing else of the queue sees them).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's STREAM (the normal lane: redeliveries go there)
-- KEYS[3], KEYS[4]  the shard's high and low lane STREAMs (an order's record names its lane;
--          see dequeue.lua)
-- KEYS[5 .. 4+k]  the shard's history buckets, newest first (see dequeue.lua); the one of
--          "now" among them records the new entries. The caller passes the two newest and
--          those it found holding one of the orders' records or redirects, not every bucket
--          of the retention
-- ARGV[1]  the group
-- ARGV[2]  k, the number of history buckets (0 = history off)
-- ARGV[3]  the bucket length, ms
-- ARGV[4 .. 3+k]  the bucket numbers of KEYS[5 .. 4+k]
-- ARGV[4+k]  now, unix ms
-- ARGV[5+k]  when the bucket of now expires, unix ms
-- ARGV[6+k ..]  the orders as pairs: id, payload JSON
--
-- For each order: scheduled (in the due ZSET) -> left alone (0); its latest entry pending in
-- the group, or not yet read by it -> left alone (2); otherwise (never dispatched, past the
-- history retention, done or dead in the group) it is appended to the stream with
-- for_group = <group> and due_ms = now (1), and the group's history follows the new entry:
-- a redirect "\2<group>\2<order id>" -> "<entry id>:<due ms>" when the order has a record
-- (the other groups keep reporting what they handled), else the order's record itself
-- (an entry only the group sees: the lookup reports that group alone). A cancelled
-- order's record (cancel.lua) counts as none.
-- Returns one code per order. Error "ERR delayq group_not_found ..." (nothing written) when
-- the group does not exist on this shard's stream: without it, nothing could tell an order
-- on its way from a lost one, and every run would append every order again.
-- Why one script: the check and the append are one step, so two runs (or a run racing a
-- schedule) never send an order twice. Every argument is checked before the first write.
-- Cost: O(orders * k) HGETs plus one XPENDING and at most one XADD per order: independent
-- of the retention, since the caller locates the buckets (k is a handful). Redis >= 6.2.
-- @include int, stream_ids, groups
local group = ARGV[1]
local k, len = int(ARGV[2]), int(ARGV[3])
if type(group) ~= 'string' or group == '' or not k or k < 0 or not len or len < 1 then
  return redis.error_reply('ERR delayq redeliver: group, bucket count and length expected')
end
for j = 1, k do
  if not int(ARGV[3 + j]) then return redis.error_reply('ERR delayq redeliver: bad bucket') end
end
local now, hist_at = int(ARGV[4 + k]), int(ARGV[5 + k])
if not now or now < 0 or not hist_at or hist_at < 0 then
  return redis.error_reply('ERR delayq redeliver: now and expiry must be unix milliseconds')
end
if (#ARGV - 5 - k) % 2 ~= 0 then
  return redis.error_reply('ERR delayq redeliver: orders come as id, payload pairs')
end
for i = 6 + k, #ARGV, 2 do
  if ARGV[i] == '' then return redis.error_reply('ERR delayq redeliver: empty order id') end
end
local wkey
for j = 1, k do
  if int(ARGV[3 + j]) == math.floor(now / len) then wkey = KEYS[4 + j] end
end
-- The group's last-delivered id in a stream (nil without the stream or the group).
local function last_in(stream)
  for _, g in ipairs(groups_of(stream)) do
    if g['name'] == group then return g['last-delivered-id'] end
  end
  return nil
end
local last = last_in(KEYS[2])
if not last then
  return redis.error_reply('ERR delayq group_not_found: the group does not exist on this shard')
end
local lanes = { high = KEYS[3], low = KEYS[4] }
local lane_last = {}
local out = {}
local hist = {}
local recorded = {}
for i = 6 + k, #ARGV, 2 do
  local id, payload = ARGV[i], ARGV[i + 1]
  local code = 1
  if redis.call('ZSCORE', KEYS[1], id) then
    code = 0
  else
    local found
    for j = 1, k do
      found = redis.call('HGET', KEYS[4 + j], '\2' .. group .. '\2' .. id)
      if found then break end
    end
    if not found then
      for j = 1, k do
        found = redis.call('HGET', KEYS[4 + j], id)
        if found then break end
      end
      -- A cancellation's record "c:..." (cancel.lua, tag_bulk.lua) is no delivery: the
      -- order is sent as one never dispatched, and its own record follows the new entry.
      if found and string.sub(found, 1, 2) == 'c:' then found = nil end
    end
    recorded[i] = found
    local eid, level
    if found then eid, level = string.match(found, '^(%d+%-%d+):%d+:?(%a*)$') end
    if eid then
      local stream, glast = KEYS[2], last
      if lanes[level] then
        stream = lanes[level]
        if lane_last[level] == nil then lane_last[level] = last_in(stream) or false end
        glast = lane_last[level]
      end
      if glast then
        local p = redis.call('XPENDING', stream, group, eid, eid, 1)
        if p[1] or id_less(glast, eid) then code = 2 end
      end
    end
  end
  if code == 1 then
    local eid = redis.call('XADD', KEYS[2], '*', 'id', id, 'due_ms', ARGV[4 + k],
      'data', ARGV[4 + k] .. ':' .. payload, 'for_group', group)
    if wkey then
      if recorded[i] then
        hist[#hist + 1] = '\2' .. group .. '\2' .. id
      else
        hist[#hist + 1] = id
      end
      hist[#hist + 1] = eid .. ':' .. ARGV[4 + k]
    end
  end
  out[#out + 1] = code
end
if #hist > 0 then
  redis.call('HSET', wkey, unpack(hist))
  redis.call('PEXPIREAT', wkey, hist_at)
end
return out
