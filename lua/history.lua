#!lua flags=no-writes
-- history.lua: what happened to one order: scheduled, or dispatched with each group's state.
--
-- Flags: no-writes (the first line): Redis 7.0+ runs it on read-only replicas and under
-- maxmemory, and refuses any write in it; older servers get the text without that line.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  the shard's STREAM (the normal lane)
-- KEYS[4]  the shard's dead-letter STREAM
-- KEYS[5], KEYS[6]  the shard's high and low lane STREAMs
-- KEYS[7]  the shard's levels HASH (see enqueue.lua)
-- KEYS[8 .. 7+k]  the shard's history buckets that may hold the order, newest first: the
--          caller passes the two newest and those it found holding the order's record or a
--          redirect (and the buckets of their entries' markers), not every bucket of the
--          retention
-- KEYS[7+k+6(i-1)+1 .. +6]  group i's timers ZSET and errors HASH in the normal, high and
--          low lanes, in that order (i = 1..g)
-- ARGV[1]  the order id
-- ARGV[2]  k, the number of history buckets
-- ARGV[3]  the bucket length, ms
-- ARGV[4 .. 3+k]  the bucket numbers of KEYS[8 .. 7+k]
-- ARGV[4+k]       the cutoff, unix ms: a record of an entry older than this is past the
--                 retention (its bucket may outlive it by up to one bucket length)
-- ARGV[5+k ..]    the group names (g of them)
--
-- Returns:
--   false                                        never seen, or past the history retention
--   { 'scheduled', due_ms, stored value or false, level or false }   waiting for its due time
--   { 'cancelled', cancel ms, due (its score text), reason }   cancelled (see cancel.lua)
--   { 'dispatched', entry id, due_ms, entry fields or false (trimmed),
--     { {group, state, attempts, last_error or false, next_attempt_ms or false,
--        late_ms or false}, ... },
--     level or false }
-- A record "<entry id>:<due ms>" is of the normal lane; "<entry id>:<due ms>:<level>" of
-- that level's lane (see dequeue.lua): its entry, pending state, timers and errors are
-- looked up there.
-- A group's state: 'waiting' (not read yet: the entry is after its last-delivered id),
-- 'running' (pending, leased), 'retrying' (pending, its current attempt failed: the errors
-- HASH holds that attempt), 'done' (acknowledged), 'dead' (history marker "d<n>:<dead id>"),
-- 'expired' (not handed to the group past due + expires_after, dead-lettered: marker
-- "x<n>:<late ms>:<dead id>", late_ms reported).
-- A done entry acknowledged after several attempts has the marker "a<n>".
-- Each group is reported on its own delivery: the order's record, or the redirect
-- "\2<group>\2<order id>" a replay or a redelivery to that group wrote (see replay.lua).
-- Read-only; one script so the answer is one consistent snapshot.
-- Cost: O(k * groups) HGETs plus one XPENDING per group: independent of the retention, since
-- the caller locates the buckets (k is a handful, not the 2,162 of a 90-day retention).
-- Redis >= 6.2.
-- @include int, stream_ids, groups
local id = ARGV[1]
local k, len = int(ARGV[2]), int(ARGV[3])
if not k or k < 0 or not len or len < 1 then
  return redis.error_reply('ERR delayq history: bucket count and length expected')
end
local cutoff = int(ARGV[4 + k])
if not cutoff then
  return redis.error_reply('ERR delayq history: the cutoff must be unix milliseconds')
end
local due = redis.call('ZSCORE', KEYS[1], id)
if due then
  return { 'scheduled', due, redis.call('HGET', KEYS[2], id) or false,
    redis.call('HGET', KEYS[7], id) or false }
end
-- The order's record (its first dispatch) and, per group, a redirect written when a replay
-- or a reconciliation redelivered it to that group alone: each group is reported on the
-- delivery it actually handles.
local function lookup(field)
  for j = 1, k do
    local v = redis.call('HGET', KEYS[7 + j], field)
    if v then return v end
  end
  return nil
end
-- A lane by its record's level: 0 = normal, 1 = high, 2 = low.
local lane_no = { [''] = 0, high = 1, low = 2 }
local streams = { [0] = KEYS[3], KEYS[5], KEYS[6] }
local function entry_of(v)
  if not v then return nil end
  local e, d, level = string.match(v, '^(%d+%-%d+):(%d+):?(%a*)$')
  if not e or parse_id(e) < cutoff then return nil end
  return e, d, lane_no[level] or 0
end
-- A cancelled order's record "c:<cancel ms>:<due>:<reason>" (cancel.lua, tag_bulk.lua;
-- include unschedule there): the newest record, so the answer, while within the retention.
local rec = lookup(id)
local c_at, c_due, c_reason = nil, nil, nil
if rec then c_at, c_due, c_reason = string.match(rec, '^c:(%d+):([^:]+):(.+)$') end
if c_at then
  if tonumber(c_at) >= cutoff then return { 'cancelled', c_at, c_due, c_reason } end
  rec = nil
end
local eid, due_ms, elane = entry_of(rec)
local ng = #ARGV - 4 - k
local per, plane = {}, {}
local any = eid ~= nil
for i = 1, ng do
  local g = ARGV[4 + k + i]
  local reid, rdue, rlane = entry_of(lookup('\2' .. g .. '\2' .. id))
  if reid then
    per[i], plane[i] = reid, rlane
    any = true
    if not eid then eid, due_ms, elane = reid, rdue, rlane end
  else
    per[i], plane[i] = eid, elane
  end
end
if not any then return false end
local function fields_of(e, lane)
  local entry = redis.call('XRANGE', streams[lane], e, e)
  if entry[1] then return entry[1][2] end
  return false
end
local fields = fields_of(eid, elane)
-- An entry made for one group only (a reconciliation of a lost order): the other groups
-- never saw the order, so they are not reported.
local only = false
if fields then
  for j = 1, #fields, 2 do if fields[j] == 'for_group' then only = fields[j + 1] end end
end
-- The bucket holding an entry's markers: the one of the entry id's time.
local function marker_bucket(e)
  local ems = parse_id(e)
  for j = 1, k do
    if int(ARGV[3 + j]) == math.floor(ems / len) then return KEYS[7 + j] end
  end
  return nil
end
-- Each lane's groups and their last-delivered ids, read once per lane that is needed.
local lasts = {}
local function last_of(lane)
  if lasts[lane] then return lasts[lane] end
  local last = {}
  for _, g in ipairs(groups_of(streams[lane])) do last[g['name']] = g['last-delivered-id'] end
  lasts[lane] = last
  return last
end
local groups = {}
for i = 1, ng do
  local g = ARGV[4 + k + i]
  local e = per[i]
  local lane = plane[i] or 0
  local base = 7 + k + 6 * (i - 1) + 2 * lane
  local timers, errors = KEYS[base + 1], KEYS[base + 2]
  local skip = (only and only ~= g and e == eid) or not e
  local last = last_of(lane)
  if last[g] and not skip then
    local p = redis.call('XPENDING', streams[lane], g, e, e, 1)
    if p[1] then
      local count = p[1][4]
      local err = redis.call('HGET', errors, e)
      local at, text = nil, nil
      if err then at, text = string.match(err, '^(%d+):(.*)$') end
      if at and tonumber(at) == count then
        groups[#groups + 1] = { g, 'retrying', count, text, redis.call('ZSCORE', timers, e) or false }
      else
        groups[#groups + 1] = { g, 'running', count, text or false, false }
      end
    elseif id_less(last[g], e) then
      groups[#groups + 1] = { g, 'waiting', 0, false, false }
    else
      local mkey = marker_bucket(e)
      local m = false
      if mkey then m = redis.call('HGET', mkey, '\1' .. g .. '\1' .. e) end
      local dn, did, late = false, false, false
      if m then dn, did = string.match(m, '^d(%d+):(.+)$') end
      if m and not dn then
        dn, late, did = string.match(m, '^x(%d+):(%d+):(.+)$')
      end
      if dn then
        local d = redis.call('XRANGE', KEYS[4], did, did)
        local err = false
        if d[1] then
          local f = d[1][2]
          for j = 1, #f, 2 do if f[j] == 'error' then err = f[j + 1] end end
        end
        if late then
          groups[#groups + 1] = { g, 'expired', tonumber(dn), err, false, tonumber(late) }
        else
          groups[#groups + 1] = { g, 'dead', tonumber(dn), err, false }
        end
      else
        local an = m and string.match(m, '^a(%d+)$')
        groups[#groups + 1] = { g, 'done', tonumber(an or 1), false, false }
      end
    end
  end
end
-- The payload: from the first delivery, or any group's redelivery once that is trimmed.
if not fields then
  for i = 1, ng do
    if per[i] and per[i] ~= eid then
      fields = fields_of(per[i], plane[i])
      if fields then break end
    end
  end
end
local levels = { [0] = false, 'high', 'low' }
return { 'dispatched', eid, due_ms, fields, groups, levels[elane] }
