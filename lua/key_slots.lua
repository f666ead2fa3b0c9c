-- key_slots.lua: a consumer group's slots per order key (`key_concurrency`, `key_sequence`),
-- shared by every process and shard of the group.
--
-- KEYS[1]  holders ZSET: member = "<key>\31<lane>:<entry id>", score = unix ms until which
--          the hold lasts (the entry's lease end; a retry's time plus a lease under
--          key_sequence; for a woken waiter, the time by which it must be taken)
-- KEYS[2]  counts HASH: key -> holders of that key (kept exact with KEYS[1])
-- KEYS[3]  waiters ZSET, all scores 0 (ordered by member): member =
--          "<key>\31<due ms, 16 digits>\31<lane>:<entry id>", so a key's waiters sort by due time
-- KEYS[4]  active ZSET: key -> holders + waiters (the busiest keys; a key leaves it when it
--          has neither)
-- KEYS[5]  entries HASH: "<lane>:<entry id>" -> key, for each hold (kept exact with KEYS[1]),
--          so a pull consumer's ack, which names only its entry, gives its hold back
--          All five live under the queue's shard 0 hash tag and expire ARGV[4] ms after their
--          last write or their latest hold's end, whichever is later: nothing outlives a
--          group that stopped.
-- ARGV[1]  mode: acquire | release | extend | held
-- ARGV[2]  now, unix ms
-- ARGV[3]  slots per key, 1..10000
-- ARGV[4]  time to live of the state past its last write and its latest hold, ms
-- ARGV[5]  acquire: hold until (unix ms); release: the hold a woken waiter gets (unix ms);
--          extend: hold until (unix ms)
-- ARGV[6..] acquire: key, "<lane>:<entry id>", due ms
--           release: (key, "<lane>:<entry id>") pairs; an empty key: the entry's own hold
--           extend:  (key, "<lane>:<entry id>") pairs (an empty key as for release); only
--                    holds that exist are moved
--           held:    key, "<lane>:<entry id>"
--
-- Returns: acquire: { granted (1|0), woken }; release: { woken }; extend: { extended count };
--   held: { 1 when the entry has a hold, else 0 } (a parked entry asks after parking: a
--   slot given to it between its refused acquire and its park found nothing to wake)
--   woken = { "<lane>:<entry id>", ... }: waiters given a slot now (held for them until
--           ARGV[5] of a release, or the acquire's hold), whose parked timers the caller
--           moves to now (park.lua unpark) so that a consumer takes them.
--
-- Why one script: the count, the holders and the waiters change together, so two processes
-- can never both take a key's last slot, and a released slot always goes to the earliest
-- waiter of its key (in due order, which is what key_sequence promises) instead of a
-- newcomer. Holds expire with their lease, so a crashed holder's slot is free again when its
-- lease would have been reclaimed; expired holds are pruned (at most 100 per call) by
-- every call.
-- Cost: acquire O(log n + w) for n holds and w waiters woken; release O(k (log n + w)) for k
-- pairs; extend O(k log n); held O(log n); plus up to 100 expired holds pruned.
-- Redis >= 6.2.
-- @include int
local mode = ARGV[1]
local now = int(ARGV[2])
local limit = int(ARGV[3])
local ttl = int(ARGV[4])
local hold = int(ARGV[5])
if not now or not hold then
  return redis.error_reply('ERR delayq key_slots: times must be unix milliseconds')
end
if not limit or limit < 1 or limit > 10000 then
  return redis.error_reply('ERR delayq key_slots: slots per key must be 1..10000')
end
if not ttl or ttl < 1 then
  return redis.error_reply('ERR delayq key_slots: time to live must be positive ms')
end
local SEP = '\31'
if mode == 'acquire' then
  if #ARGV ~= 8 or not int(ARGV[8]) then
    return redis.error_reply('ERR delayq key_slots: acquire takes key, member, due ms')
  end
elseif mode == 'release' or mode == 'extend' or mode == 'held' then
  if #ARGV % 2 ~= 1 then
    return redis.error_reply('ERR delayq key_slots: key/member pairs expected')
  end
else
  return redis.error_reply('ERR delayq key_slots: unknown mode')
end
for i = 6, #ARGV, 2 do
  if (mode == 'acquire' and ARGV[i] == '') or string.find(ARGV[i], SEP, 1, true) then
    return redis.error_reply('ERR delayq key_slots: bad order key')
  end
end

local function refresh(key)
  local n = tonumber(redis.call('HGET', KEYS[2], key) or '0')
  local w = redis.call('ZLEXCOUNT', KEYS[3], '[' .. key .. SEP, '(' .. key .. '\32')
  if n + w > 0 then
    redis.call('ZADD', KEYS[4], n + w, key)
  else
    redis.call('ZREM', KEYS[4], key)
  end
end

local function drop_hold(key, member)
  if redis.call('ZREM', KEYS[1], key .. SEP .. member) == 1 then
    if redis.call('HINCRBY', KEYS[2], key, -1) <= 0 then redis.call('HDEL', KEYS[2], key) end
    redis.call('HDEL', KEYS[5], member)
    return true
  end
  return false
end

local function add_hold(key, member, until_ms)
  if redis.call('ZADD', KEYS[1], until_ms, key .. SEP .. member) == 1 then
    redis.call('HINCRBY', KEYS[2], key, 1)
    redis.call('HSET', KEYS[5], member, key)
  end
end

-- The key of pair i: given, or (empty) the one the entry holds (nil when it holds none).
local function key_of(i)
  if ARGV[i] ~= '' then return ARGV[i] end
  return redis.call('HGET', KEYS[5], ARGV[i + 1])
end

-- Holds past their time: their holder stopped extending them (it crashed, or a woken
-- waiter was never taken).
local touched = {}
local expired = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, 100)
for _, m in ipairs(expired) do
  local s = string.find(m, SEP, 1, true)
  local key = string.sub(m, 1, s - 1)
  drop_hold(key, string.sub(m, s + 1))
  touched[key] = true
end

-- Gives free slots of `key` to its earliest waiters, held until `until_ms`.
local function fill(key, until_ms, woken)
  local free = limit - tonumber(redis.call('HGET', KEYS[2], key) or '0')
  if free <= 0 then return end
  local first = redis.call('ZRANGE', KEYS[3], '[' .. key .. SEP, '(' .. key .. '\32', 'BYLEX',
    'LIMIT', 0, free)
  for _, w in ipairs(first) do
    redis.call('ZREM', KEYS[3], w)
    local member = string.sub(w, #key + 19)
    add_hold(key, member, until_ms)
    woken[#woken + 1] = member
  end
end

local woken = {}
local result
if mode == 'acquire' then
  local key, member = ARGV[6], ARGV[7]
  local waiter = key .. SEP .. string.format('%016d', int(ARGV[8])) .. SEP .. member
  touched[key] = true
  if redis.call('ZSCORE', KEYS[1], key .. SEP .. member) then
    -- Already held for it: a woken waiter, or a retry of a key_sequence.
    redis.call('ZADD', KEYS[1], hold, key .. SEP .. member)
    redis.call('ZREM', KEYS[3], waiter)
    result = { 1 }
  else
    -- It waits in due order with the others; the earliest ones get the free slots.
    redis.call('ZADD', KEYS[3], 0, waiter)
    fill(key, hold, woken)
    local granted = 0
    for i, m in ipairs(woken) do
      if m == member then
        granted = 1
        table.remove(woken, i)
        break
      end
    end
    result = { granted }
  end
elseif mode == 'release' then
  for i = 6, #ARGV, 2 do
    local key = key_of(i)
    if key then
      drop_hold(key, ARGV[i + 1])
      touched[key] = true
    end
  end
  result = {}
elseif mode == 'held' then
  if redis.call('ZSCORE', KEYS[1], ARGV[6] .. SEP .. ARGV[7]) then result = { 1 } else result = { 0 } end
else
  local n = 0
  for i = 6, #ARGV, 2 do
    local key = key_of(i)
    local m = key and (key .. SEP .. ARGV[i + 1])
    if m and redis.call('ZSCORE', KEYS[1], m) then
      redis.call('ZADD', KEYS[1], hold, m)
      n = n + 1
    end
  end
  result = { n }
end
if mode == 'acquire' or mode == 'release' then
  for key in pairs(touched) do
    fill(key, hold, woken)
    refresh(key)
  end
  result[#result + 1] = woken
else
  for key in pairs(touched) do refresh(key) end
end
-- The state lives `ttl` past the latest hold's end, so a long hold (a sequence's retry an
-- hour away, a pull lease) keeps its key however quiet the group is meanwhile.
local live = ttl
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) - now + ttl > live then live = tonumber(last[2]) - now + ttl end
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], live) end
return result
