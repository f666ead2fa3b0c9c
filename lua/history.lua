-- history.lua: what happened to one order: scheduled, or dispatched with each group's state.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  the shard's STREAM
-- KEYS[4]  the shard's dead-letter STREAM
-- KEYS[5 .. 4+k]  the shard's history buckets that may hold the order, newest first
-- KEYS[4+k+2i-1], KEYS[4+k+2i]  group i's timers ZSET and errors HASH (i = 1..g)
-- ARGV[1]  the order id
-- ARGV[2]  k, the number of history buckets
-- ARGV[3]  the bucket length, ms
-- ARGV[4 .. 3+k]  the bucket numbers of KEYS[5 .. 4+k]
-- ARGV[4+k ..]    the group names (g of them)
--
-- Returns:
--   false                                        never seen, or past the history retention
--   { 'scheduled', due_ms, stored value or false }   waiting for its due time
--   { 'dispatched', entry id, due_ms, entry fields or false (trimmed),
--     { {group, state, attempts, last_error or false, next_attempt_ms or false}, ... } }
-- A group's state: 'waiting' (not read yet: the entry is after its last-delivered id),
-- 'running' (pending, leased), 'retrying' (pending, its current attempt failed: the errors
-- HASH holds that attempt), 'done' (acknowledged), 'dead' (history marker "d<n>:<dead id>").
-- A done entry acknowledged after several attempts has the marker "a<n>".
-- Read-only; one script so the answer is one consistent snapshot. Redis >= 6.2.
local function int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^-?[0-9]+$') then return nil end
  return tonumber(s)
end
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  return am < bm or (am == bm and as < bs)
end
local id = ARGV[1]
local k, len = int(ARGV[2]), int(ARGV[3])
if not k or k < 0 or not len or len < 1 then
  return redis.error_reply('ERR delayq history: bucket count and length expected')
end
local due = redis.call('ZSCORE', KEYS[1], id)
if due then
  return { 'scheduled', due, redis.call('HGET', KEYS[2], id) or false }
end
local found
for j = 1, k do
  found = redis.call('HGET', KEYS[4 + j], id)
  if found then break end
end
if not found then return false end
local eid, due_ms = string.match(found, '^(%d+%-%d+):(.+)$')
if not eid then return false end
local ems = parse_id(eid)
local entry = redis.call('XRANGE', KEYS[3], eid, eid)
local fields = false
if entry[1] then fields = entry[1][2] end
-- The bucket holding the entry's markers: the one of the entry id's time.
local mkey
for j = 1, k do
  if int(ARGV[3 + j]) == math.floor(ems / len) then mkey = KEYS[4 + j] end
end
local last = {}
if redis.call('EXISTS', KEYS[3]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[3])) do
    local name, ld
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
    end
    last[name] = ld
  end
end
local groups = {}
local ng = #ARGV - 3 - k
for i = 1, ng do
  local g = ARGV[3 + k + i]
  local timers, errors = KEYS[4 + k + 2 * i - 1], KEYS[4 + k + 2 * i]
  if last[g] then
    local p = redis.call('XPENDING', KEYS[3], g, eid, eid, 1)
    if p[1] then
      local count = p[1][4]
      local err = redis.call('HGET', errors, eid)
      local at, text = nil, nil
      if err then at, text = string.match(err, '^(%d+):(.*)$') end
      if at and tonumber(at) == count then
        groups[#groups + 1] = { g, 'retrying', count, text, redis.call('ZSCORE', timers, eid) or false }
      else
        groups[#groups + 1] = { g, 'running', count, text or false, false }
      end
    elseif less(last[g], eid) then
      groups[#groups + 1] = { g, 'waiting', 0, false, false }
    else
      local m = false
      if mkey then m = redis.call('HGET', mkey, '\1' .. g .. '\1' .. eid) end
      local dn, did = false, false
      if m then dn, did = string.match(m, '^d(%d+):(.+)$') end
      if dn then
        local d = redis.call('XRANGE', KEYS[4], did, did)
        local err = false
        if d[1] then
          local f = d[1][2]
          for j = 1, #f, 2 do if f[j] == 'error' then err = f[j + 1] end end
        end
        groups[#groups + 1] = { g, 'dead', tonumber(dn), err, false }
      else
        local an = m and string.match(m, '^a(%d+)$')
        groups[#groups + 1] = { g, 'done', tonumber(an or 1), false, false }
      end
    end
  end
end
return { 'dispatched', eid, due_ms, fields, groups }
