-- dequeue.lua: move due orders, earliest first, from the schedule into the shard's stream,
-- and record each one's stream entry in the order history.
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's STREAM       one entry per dispatched order
-- KEYS[4]  the shard's history bucket for "now" ({ns:q:s}:history:<bucket_ms>:<bucket>):
--          HASH order id -> "<entry id>:<due ms>"
-- KEYS[5]  the shard's meta HASH: while its field `paused` is set, nothing is moved
-- KEYS[6]  the shard's levels HASH (order id -> high or low; see enqueue.lua)
-- KEYS[7]  the shard's high lane STREAM, KEYS[8] its low lane STREAM
-- KEYS[9]  the shard's dispatched ZSET, KEYS[10] its debounce HASH (enqueue.lua)
-- KEYS[11] the shard's tag index ZSET (enqueue.lua)
-- KEYS[12] the shard's key index ZSET, KEYS[13] its key ring ZSET (issue 42; see keyed.lua
--          and enqueue.lua)
--          Always all 13 KEYS (one arity; the caller is the Rust dispatcher alone).
-- ARGV[1]  now, unix ms (the Redis server clock, read by the caller)
-- ARGV[2]  batch limit, 1..1000 (each order costs several us of Redis time; keep calls short)
-- ARGV[3]  when the history bucket expires, unix ms (0 = history off: KEYS[4] is untouched)
-- ARGV[4]  optional: "1" reads and deletes the batch's payloads with one HGETDEL (Redis 8.0,
--          Valkey 9.0; the caller knows from INFO at connect), "0" or absent with HMGET + HDEL
--
-- Returns: { moved, next_due_ms, paused, gone }  moved = orders written to the stream by
--          this call, next_due_ms = score of the earliest order still scheduled (nil when
--          none), paused = 1 when the queue's dispatch is paused (then moved is 0), gone = 1
--          when the shard has no epoch (the queue was deleted, or Redis lost its data: a
--          dispatcher the application made declares its queue again, one a supervisor made
--          leaves it to the registry). Due orders are moved either way.
-- The pause flag is read here, inside the script, so once a pause has been written no
-- dispatch starts: it takes effect when the pause command answers, not at a later poll.
--
-- Priorities: with KEYS[6], an order whose level is high or low goes into that lane's
-- stream instead of KEYS[3], with the extra field priority = <level> (dead letters and
-- replays keep it), and its history record ends in ":<level>". A lane's stream is made on
-- first use with every group of KEYS[3] (`open_lane`, include `lanes`). Without a levels HASH (a
-- queue that never used priorities) this costs one EXISTS per call.
-- Stream entry fields: id, due_ms, data = the HASH value as stored ("<enqueued_ms>:<json>",
-- split by the consumer so Redis does no string work), or, when the HASH field is missing
-- (tampered with), id, due_ms, flag = "payload_missing" and no data: still forwarded, never
-- dropped.
--
-- Why one script: the due orders are exactly the lowest scores, so ZCOUNT + ZPOPMIN take
-- them earliest first in one pass (ties in member order, as ZRANGE would); ZPOPMIN, HDEL,
-- XADD and the history record happen together, so no crash can lose an order between
-- "removed" and "written", or leave a dispatched order without its history.
-- The history costs one HSET (all the batch's fields) and one PEXPIREAT per call: about a
-- fifth more Redis CPU per dispatched order, ~92 bytes per order (docs/benchmarks.md).
-- Time rules (issue 44): while the meta hash has `dedup_ms` (the queue's dedup window), each
-- moved id is added to the dispatched ZSET scored by now, the key's expiry is pushed to
-- now + window (a shard that stops dispatching frees it whole), and at most `limit` ids
-- older than the window are trimmed per call (ZCOUNT + ZREMRANGEBYRANK: O(log D + limit);
-- a call adds at most `limit`, so trimming keeps pace). With `debounce`, the moved ids'
-- debounce records are dropped. Neither field set: no extra command.
-- Tags (issue 43): while the meta hash has `tags` (the shard has had tagged orders), the moved
-- orders' index members are removed (their tags read from the values this call already
-- holds: one ZREM per call); a shard without it does no work for tags.
-- Fair share between keys (issue 42; keyed.lua): while the meta hash has `keys` (the shard
-- holds keyed orders), the due orders are not taken earliest first
-- but round robin between the participants that have due work: each key on the ring due
-- by now (earliest first), the unkeyed orders indexed under "" among them, and the unkeyed
-- orders written before the mark as one more participant (found among the first `limit`
-- due orders; not looked for when every scheduled order is indexed). Each round takes one
-- order of each participant, in due order within it; the stream then holds them
-- interleaved, so a key with 200 due orders is served alongside one with 20,000, not after
-- it. When every due order fits the call (ZCOUNT <= limit: a steady flow, or a backlog's
-- last call) they are popped as on the plain path and put round robin from their values'
-- keys, with one read per key for its next ring score (take_all): no index read before the
-- pop, no member checked against the schedule. A larger backlog: a call takes at most
-- ceil(limit / TURN) keys, so each has a turn of up to TURN orders (one index read then
-- serves up to TURN orders, not one, when many keys are due).
-- A key served is scored on the ring by at least this call's now, so the keys not
-- served come first in the next call (when more keys are due than a call takes). An index
-- member whose order is gone or was moved (its score in KEYS[1] is not its due time) is
-- dropped, never dispatched. When no keyed order is left, the "" members and the mark go:
-- the shard takes the plain path again, at no extra cost. Cost with keys: O((p + m) log N)
-- for p participants (p <= ceil(m / TURN) + 1; one ZRANGE BYLEX each per pass, bounded to
-- the key's due members, so a key's later orders are never read; one ZREMRANGEBYLEX per
-- key for the members it took; plus one read of its first member for a key whose due
-- orders were all taken: its next ring score) and m orders moved, bounded by ARGV[2]; a
-- call that takes every due order (take_all) O(m log N) for its ZPOPMIN and ZREM (or one
-- ZREMRANGEBYLEX per key with several of the m) plus one O(log N) read per distinct key
-- among the m (at most ARGV[2] reads); the last keyed order's call also O(u) for the u
-- unkeyed members it drops.
-- Every argument is checked before the first write.
-- Cost: O(m log n) for m orders moved out of a schedule of n (ZPOPMIN, the payloads' HMGET
-- and HDEL, one XADD and one history HSET each), bounded by ARGV[2]; nothing due: O(log n).
-- Redis >= 6.2.
-- @include int, tags, lanes, keyed
local now = int(ARGV[1])
local limit = int(ARGV[2])
local hist_at = int(ARGV[3])
local getdel = ARGV[4] == '1'
if ARGV[4] ~= nil and ARGV[4] ~= '0' and ARGV[4] ~= '1' then
  return redis.error_reply('ERR delayq dequeue: the HGETDEL flag must be 0 or 1')
end
if #KEYS ~= 13 then
  return redis.error_reply('ERR delayq dequeue: 13 KEYS expected')
end
if not now then
  return redis.error_reply('ERR delayq dequeue: now must be unix milliseconds')
end
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR delayq dequeue: limit must be 1..1000')
end
if not hist_at or hist_at < 0 then
  return redis.error_reply('ERR delayq dequeue: history expiry must be unix milliseconds or 0')
end

-- The epoch and the pause flag in one read of the meta hash.
local meta = redis.call('HMGET', KEYS[5], 'epoch', 'paused', 'dedup_ms', 'debounce', 'tags', 'keys')
local window = tonumber(meta[3] or '0') or 0
local gone = 0
if not meta[1] then gone = 1 end
if meta[2] then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return { 0, first[2] or false, 1, gone }
end

-- The least turn of a key in one call, in orders (see the header).
local TURN = 8
-- An index member's due time as canonical digits, and its order id. Due times go into the
-- stream entries, the history and the ring as these strings: a Lua number would be
-- formatted again for each (about half a microsecond per order).
local DUE_ID = '^[^\31]*\31' .. '0*(%d+)\31(.*)$'

-- No keyed order left (the ring empty, or holding only the unkeyed participant ""): the
-- unkeyed members go, and the mark, so the shard takes the plain path again.
local function unmark_when_done()
  local kidx, kring = KEYS[12], KEYS[13]
  local left_keys = redis.call('ZCARD', kring)
  if left_keys == 0 or (left_keys == 1 and redis.call('ZSCORE', kring, '')) then
    redis.call('ZREMRANGEBYLEX', kidx, '[\31', '(\32')
    redis.call('ZREM', kring, '')
    redis.call('HDEL', KEYS[5], 'keys')
  end
end

-- The due orders to move, round robin between the keys with due work and the unkeyed
-- orders (see the header); removes them from the schedule and the key index.
local function fair_share(now, limit)
  local kidx, kring = KEYS[12], KEYS[13]
  -- The unkeyed participant: the unkeyed orders among the first `limit` due ones. An order
  -- counts as keyed only when its index member is there (so none is ever stranded). A
  -- shard whose scheduled orders are all keyed (ZCARD of both equal) skips the look.
  local plain, head = {}, {}
  if redis.call('ZCARD', kidx) < redis.call('ZCARD', KEYS[1]) then
    head = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  end
  if #head > 0 then
    local hid = {}
    for i = 1, #head, 2 do hid[#hid + 1] = head[i] end
    local vals = redis.call('HMGET', KEYS[2], unpack(hid))
    local members = {}
    for j = 1, #hid do
      members[j] = key_member(stored_key(vals[j]) or '', head[2 * j], hid[j])
    end
    local there = redis.call('ZMSCORE', kidx, unpack(members))
    for j = 1, #members do
      if not there[j] then plain[#plain + 1] = j end
    end
  end
  -- The participants: the keys with due work, earliest first, then the unkeyed orders.
  -- A participant's orders read so far are its arrays `id`, `ds` (due, canonical digits)
  -- and, for a key, `m` (its index members, the first of its range, in due order), `n` of
  -- them; `cut` of them are consumed (taken, or stale and skipped: a prefix, taken round
  -- by round), `stale` marks the stale ones; `peek` is the member after them (nil: none,
  -- the key has no more due), so its next head is known without another read. Plain
  -- arrays and counters, not a table per order: the Lua here is most of a keyed order's
  -- cost.
  local parts, keyed = {}, {}
  local takes = math.ceil(limit / TURN)
  -- A key's read is bounded to its members due by now, never its later ones.
  local due_bound = key_due_bound(now)
  for _, key in ipairs(redis.call('ZRANGE', kring, '-inf', now, 'BYSCORE', 'LIMIT', 0, takes)) do
    local lo, hi = key_range(key, due_bound)
    local part = { key = key, kl = #key, lo = lo, hi = hi, n = 0, cut = 0, more = true, id = {}, ds = {}, m = {}, stale = {} }
    parts[#parts + 1] = part
    keyed[#keyed + 1] = part
  end
  if #plain > 0 then
    parts[#parts + 1] = { n = 0, cut = 0, more = true, id = {}, ds = {}, stale = {} }
  end
  -- The canonical digits of each fixed-width due time met (a storm's orders share few).
  local ids, dues, ni, canon = {}, {}, 0, {}
  local left = limit
  while left > 0 and #parts > 0 do
    -- Each participant's next `q` due orders (a key's read with one more, its peek).
    local q = math.ceil(left / #parts)
    local base, cand, cpart, cj, nc = {}, {}, {}, {}, 0
    for p, part in ipairs(parts) do
      local n, pid, pds = part.n, part.id, part.ds
      base[p] = n
      if part.key then
        local got = redis.call('ZRANGE', kidx, part.lo, part.hi, 'BYLEX', 'LIMIT', n, q + 1)
        local g = #got
        part.peek = got[q + 1]
        part.more = g > q
        if g > q then g = q end
        -- A malformed due time gets "", which no score equals: dropped as stale.
        local kl, pm = part.kl, part.m
        for j = 1, g do
          local m = got[j]
          local d16, id = key_cut(m, kl)
          local ds = canon[d16]
          if not ds then
            ds = string.match(d16, '^0*(%d+)$') or ''
            canon[d16] = ds
          end
          n = n + 1
          pm[n], pid[n], pds[n] = m, id, ds
          nc = nc + 1
          cand[nc], cpart[nc], cj[nc] = id, part, n
        end
      else
        for j = n + 1, math.min(n + q, #plain) do
          local h = plain[j]
          pid[j], pds[j] = head[2 * h - 1], head[2 * h]
        end
        n = math.min(n + q, #plain)
        part.more = n < #plain
      end
      part.n = n
    end
    -- The keyed candidates checked against the schedule in one call: a member whose order
    -- is gone or was moved is stale, dropped, never dispatched.
    for s = 1, nc, 1000 do
      local sc = redis.call('ZMSCORE', KEYS[1], unpack(cand, s, math.min(s + 999, nc)))
      for j = 1, #sc do
        local c = s + j - 1
        local part = cpart[c]
        -- Both canonical digits (Redis formats an integral score so).
        if sc[j] ~= part.ds[cj[c]] then part.stale[cj[c]] = true end
      end
    end
    for r = 1, q do
      for p = 1, #parts do
        local part = parts[p]
        local j = base[p] + r
        if j <= part.n and left > 0 then
          part.cut = j
          if not part.stale[j] then
            ni = ni + 1
            ids[ni], dues[ni] = part.id[j], part.ds[j]
            left = left - 1
            part.served = true
          end
        end
      end
    end
    local still = {}
    for p, part in ipairs(parts) do
      if part.more and part.n > base[p] then still[#still + 1] = part end
    end
    parts = still
  end
  -- Out of the schedule and the index: what is moved, and the stale members (a member
  -- read but not moved, past the limit, stays). What goes of a key's members read is a
  -- prefix of them plus any stale one after it: the prefix goes in one ZREMRANGEBYLEX (one
  -- search of the index, not one per member), the rest by ZREM. Each key read gets its new
  -- head's due time on the ring (now when it was served), in one ZADD; a key left empty
  -- leaves it.
  for s = 1, ni, 1000 do redis.call('ZREM', KEYS[1], unpack(ids, s, math.min(s + 999, ni))) end
  local rm, ring, empty, unread = {}, {}, {}, {}
  for _, part in ipairs(keyed) do
    local cut, n, stale, pm = part.cut, part.n, part.stale, part.m
    while cut < n and stale[cut + 1] do cut = cut + 1 end
    if cut == 1 then
      rm[#rm + 1] = pm[1]
    elseif cut > 1 then
      redis.call('ZREMRANGEBYLEX', kidx, part.lo, '[' .. pm[cut])
    end
    -- The key's new head: its first member read and left, else the one after them; both
    -- are due by now (read under the bound), so a key served is scored now.
    local nexthead, due, changed = part.peek, nil, cut > 0
    for j = cut + 1, n do
      if stale[j] then
        changed = true
        rm[#rm + 1] = pm[j]
      elseif not due then
        nexthead, due = pm[j], part.ds[j]
      end
    end
    if changed then
      if not nexthead then
        unread[#unread + 1] = part
      else
        if part.served then
          due = ARGV[1]
        elseif not due then
          due = select(2, key_parse(nexthead))
        end
        ring[#ring + 1] = due
        ring[#ring + 1] = part.key
      end
    end
  end
  for s = 1, #rm, 1000 do redis.call('ZREM', kidx, unpack(rm, s, math.min(s + 999, #rm))) end
  -- A key whose due orders were all taken: its next (later) one, if any, is the index's
  -- first member of the key now (read after the removals above).
  for _, part in ipairs(unread) do
    local nexthead = key_orders(kidx, part.key, 0, 1)[1]
    if nexthead then
      -- Due after now: every member due by now was read and is gone.
      ring[#ring + 1] = select(2, key_parse(nexthead))
      ring[#ring + 1] = part.key
    else
      empty[#empty + 1] = part.key
    end
  end
  for s = 1, #ring, 1000 do redis.call('ZADD', kring, unpack(ring, s, math.min(s + 999, #ring))) end
  for s = 1, #empty, 1000 do redis.call('ZREM', kring, unpack(empty, s, math.min(s + 999, #empty))) end
  unmark_when_done()
  return ids, dues
end

-- Reads and deletes the payloads of `ids` (one HGETDEL, or HMGET + HDEL).
local function take_values(ids)
  if getdel then
    return redis.call('HGETDEL', KEYS[2], 'FIELDS', #ids, unpack(ids))
  end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  return vals
end

-- Every due order fits this call (`n` of them, n <= limit): there is nothing to share
-- between calls, only within this one. They are popped earliest first, their payloads read
-- (once, for the stream too) and their keys taken from them; the stream gets them round
-- robin between the keys, one order of each key per round in due order within a key (the
-- order fair_share writes), the unkeyed ones one participant. Their index members go by name
-- in one ZREM (a key with several here: by its due range), and each key's ring score
-- becomes its next member's due time (one read per key) or
-- the key leaves the ring. No key is read before the pop and no member is checked against
-- the schedule: the orders come from it. Returns ids, dues and values in stream order.
local function take_all(n, now)
  local kidx, kring = KEYS[12], KEYS[13]
  local popped = redis.call('ZPOPMIN', KEYS[1], n)
  local pid, pdue = {}, {}
  for i = 1, n do pid[i] = popped[2 * i - 1]; pdue[i] = popped[2 * i] end
  local pv = take_values(pid)
  local rank, count, rounds, pk = {}, {}, 1, {}
  for i = 1, n do
    local k = stored_key(pv[i]) or ''
    local c = (count[k] or 0) + 1
    count[k] = c
    rank[i] = c
    pk[i] = k
    if c > rounds then rounds = c end
  end
  -- A key with one order here loses its member by name; one with more loses its due range
  -- (every order due by now was popped: each of its members due by now goes, a stale one
  -- with them), one search of the index instead of one per member.
  local members, cleared, due_bound = {}, {}, nil
  for i = 1, n do
    local k = pk[i]
    if count[k] == 1 then
      members[#members + 1] = key_member(k, pdue[i], pid[i])
    elseif not cleared[k] then
      cleared[k] = true
      due_bound = due_bound or key_due_bound(now)
      redis.call('ZREMRANGEBYLEX', kidx, key_range(k, due_bound))
    end
  end
  if #members > 0 then redis.call('ZREM', kidx, unpack(members)) end
  local ring, empty = {}, {}
  for k in pairs(count) do
    local head = key_orders(kidx, k, 0, 1)[1]
    if head then
      ring[#ring + 1] = string.match(head, DUE_ID)
      ring[#ring + 1] = k
    else
      empty[#empty + 1] = k
    end
  end
  if #ring > 0 then redis.call('ZADD', kring, unpack(ring)) end
  if #empty > 0 then redis.call('ZREM', kring, unpack(empty)) end
  unmark_when_done()
  if rounds == 1 then return pid, pdue, pv end
  local by = {}
  for r = 1, rounds do by[r] = {} end
  for i = 1, n do
    local b = by[rank[i]]
    b[#b + 1] = i
  end
  local ids, dues, vals, j = {}, {}, {}, 0
  for r = 1, rounds do
    for _, i in ipairs(by[r]) do
      j = j + 1
      ids[j], dues[j], vals[j] = pid[i], pdue[i], pv[i]
    end
  end
  return ids, dues, vals
end

-- ids[i], dues[i]: the orders moved, in stream order.
local ids, dues, n, vals = {}, {}, 0, nil
if meta[6] then
  -- A backlog larger than the call is shared between calls (fair_share); one the call takes
  -- whole needs no key read before the pop (take_all).
  n = redis.call('ZCOUNT', KEYS[1], '-inf', now)
  if n > limit then
    ids, dues = fair_share(now, limit)
    n = #ids
  elseif n > 0 then
    ids, dues, vals = take_all(n, now)
  end
else
  n = redis.call('ZCOUNT', KEYS[1], '-inf', now)
  if n > limit then n = limit end
  if n > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[1], n)
    for i = 1, n do ids[i] = popped[2 * i - 1]; dues[i] = popped[2 * i] end
  end
end
if n > 0 then
  if not vals then vals = take_values(ids) end
  local levels = nil
  if redis.call('EXISTS', KEYS[6]) == 1 then
    levels = redis.call('HMGET', KEYS[6], unpack(ids))
    redis.call('HDEL', KEYS[6], unpack(ids))
  end
  local lane_keys = { high = KEYS[7], low = KEYS[8] }
  local hist = {}
  for i = 1, n do
    local v = vals[i]
    local level = levels and levels[i]
    local eid
    if level and lane_keys[level] then
      local lane = lane_keys[level]
      open_lane(lane, KEYS[3], KEYS[5], 'lane:' .. level)
      if v then
        eid = redis.call('XADD', lane, '*', 'id', ids[i], 'due_ms', dues[i], 'data', v, 'priority', level)
      else
        eid = redis.call('XADD', lane, '*', 'id', ids[i], 'due_ms', dues[i], 'flag', 'payload_missing', 'priority', level)
      end
      if hist_at > 0 then
        hist[#hist + 1] = ids[i]
        hist[#hist + 1] = eid .. ':' .. dues[i] .. ':' .. level
      end
    else
      if v then
        eid = redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', dues[i], 'data', v)
      else
        eid = redis.call('XADD', KEYS[3], '*', 'id', ids[i], 'due_ms', dues[i], 'flag', 'payload_missing')
      end
      if hist_at > 0 then
        -- One concatenation of strings Redis already handed over: building strings in Lua
        -- (match, format) costs more than the HSET itself.
        hist[#hist + 1] = ids[i]
        hist[#hist + 1] = eid .. ':' .. dues[i]
      end
    end
  end
  if #hist > 0 then
    redis.call('HSET', KEYS[4], unpack(hist))
    redis.call('PEXPIREAT', KEYS[4], hist_at)
  end
  if window > 0 then
    local d = {}
    for i = 1, n do d[2 * i - 1] = now; d[2 * i] = ids[i] end
    redis.call('ZADD', KEYS[9], unpack(d))
    redis.call('PEXPIRE', KEYS[9], window)
  end
  if meta[4] then redis.call('HDEL', KEYS[10], unpack(ids)) end
  if meta[5] then
    local members = {}
    for i = 1, n do
      local list = tag_list(vals[i])
      if list then each_tag(list, ids[i], members, true) end
    end
    local rm = {}
    for m in pairs(members) do rm[#rm + 1] = m end
    if #rm > 0 then redis.call('ZREM', KEYS[11], unpack(rm)) end
  end
end
if window > 0 then
  local old = redis.call('ZCOUNT', KEYS[9], '-inf', '(' .. (now - window))
  if old > 0 then redis.call('ZREMRANGEBYRANK', KEYS[9], 0, math.min(old, limit) - 1) end
end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return { n, head[2] or false, 0, gone }
