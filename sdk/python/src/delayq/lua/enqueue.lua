-- enqueue.lua: schedule a batch of orders atomically (ZADD due time + HSET payload).
--
-- KEYS[1]  the shard's due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the shard's payload HASH field = order id, value = "<enqueued_ms>:<payload JSON>"
-- KEYS[3]  the shard's meta HASH  field epoch = the queue's epoch while it exists
-- KEYS[4]  the shard's levels HASH (field = order id, value = high or low, for the
--          scheduled orders that are not normal): each written order's level is set
-- KEYS[5]  the shard's dispatched ZSET (order id scored by its last dispatch, unix ms;
--          written by dequeue.lua while the queue has a dedup window)
-- KEYS[6]  the shard's tag index ZSET (score 0, member "<tag>\x1f<id>" per tag of each
--          scheduled order; src/engine/tags.rs)
-- KEYS[7]  the shard's debounce HASH (order id -> "<first call ms>:<cap ms>" of a waiting
--          debounced order)
-- KEYS[8]  the shard's key index ZSET, KEYS[9] its key ring ZSET (issue 42; see keyed.lua)
-- KEYS[10] the shard's remembered events ZSET (member = a cancel-on-event match token,
--          score = until when it is remembered, unix ms; src/engine/events.rs): a new order
--          carrying a remembered token is not written (code 4)
--          Always all 10 KEYS (one arity; any other count is refused).
-- ARGV[1]  mode: "upsert" (a known id gets the new due time and payload)
--                or "nx" (a known id is left untouched); "upsert+tags" / "nx+tags" when
--                some order of the call has tags (its payload argument then holds
--                "\x1d<tag1>\x1f<tag2>\x1d" after an optional "!<ms>!" and key prefix);
--          then optionally ":<columns>", columns "", "r", "k" or "rk": the orders are id,
--          due_ms, payload, level, then the rules column (r) and the key column (k: the
--          order's key, "" for none). Without ":" the columns are "r" (quintuples).
-- ARGV[2]  now: the enqueue time, unix ms (the Redis server clock, read by the caller)
-- ARGV[3]  the queue's epoch as the caller read it from the registry record; a producer
--          that computes cancel-on-event tokens appends "\x1f<rules version>" ("" for no
--          rules): a version other than the meta hash's field `cancel_on` (or than either of
--          its "<old>|<new>" while the rules change) is refused as
--          stale_epoch (the caller re-reads the record); no "\x1f" on a shard with rules is
--          refused (an older producer would schedule orders without their tokens)
-- ARGV[4..] the orders, repeated: id, due_ms (integer), payload (JSON text), level ("high",
--           "low", or "" or "normal" for normal), then the columns of ARGV[1]: rules: "" or
--           "r" (repeat: schedule it even if dispatched within the dedup window), then
--           optionally the order's debounce max_wait in ms (due_ms is then now + its delay);
--           key: the order's key ("" for none)
--
-- Numbers are canonical decimal integers ("^-?[0-9]+$", at most 2^53 - 1, not negative):
-- " 5", "5 ", "1e3", "0x10", "nan", "inf" and "" are refused. Redis >= 6.2.
--
-- Returns: an array with one code per order, in argument order:
--          1 = created, 2 = updated (upsert of a known id), 0 = unchanged (nx of a known id);
--          { 3, dispatched_ms } = duplicate (not waiting, dispatched within the queue's dedup
--          window: nothing written); a debounced order written: { 1 or 2, due_ms };
--          { 4, token } = cancelled by an event that arrived first (a new order with a
--          match token remembered in KEYS[10]: nothing written).
--
-- Tags (issue 43; src/engine/tags.rs): the index is kept exact in this call: a written order's
-- tags are added, an upsert's old tags (parsed from the old stored value) removed. The
-- meta hash's field `tags` says the shard has had tagged orders: while it is absent and the
-- call carries none, nothing more is done (an untagged call on an untagged shard pays one
-- more field in the meta hash's HMGET, nothing per order).
-- Events (issue 43 item 4): match tokens are tags starting with \x01. Only a call that
-- carries tags looks for them (one string.find per order; one ZMSCORE per 1,000 tokens
-- found): an untagged call does nothing more, per order or per call.
-- Time rules (issue 44; the Rust side is src/engine/time_rules.rs). The dedup window is the shard meta hash's field `dedup_ms` (read in
-- the same HMGET as the epoch: a queue without one pays nothing more); with it, one
-- ZMSCORE per 1,000 ids. Debounce: a waiting order's record holds its first call's time
-- and its cap (first + max_wait); each call sets due = min(now + delay, cap), payload
-- replaced; an order not waiting starts afresh (the record lives while the order waits: a
-- plain upsert keeps it; dispatch and cancel drop it). The meta hash's field `debounce` tells
-- dequeue.lua that the shard has records to drop (a shard that never saw one pays nothing).
-- A call without time rules sends no more per order than before (quadruples, mode ":").
-- Keys (issue 42): a keyed order (its key column not "") is also indexed (KEYS[8], KEYS[9]:
-- one member per order, one ZADD of them, and one ZADD LT lowering the keys' ring scores)
-- and the meta hash's field `keys` is set; while it is set, unkeyed orders written are
-- indexed under "" too. An
-- upsert on a shard with `keys` reads the known ids' stored values (one HMGET, and one
-- ZMSCORE for the unkeyed ones' members) and moves their members (an upsert without a key
-- moves the order under ""). A shard without `keys` and a call without keys pay nothing
-- more.
-- Cost: O(n log N) for n orders and N scheduled, + O(n log D) with a window (D ids kept).
-- Errors:  "ERR delayq queue_not_found ..." when the shard has no epoch (the queue was
--          deleted, or is being deleted); "ERR delayq stale_epoch ..." when it has another
--          one (deleted and created again): the caller re-reads the registry and retries.
--          Either way nothing is written: a producer with a stale view can never write
--          into a deleted queue, because the delete removes the epoch first.
--
-- Every argument is checked before anything is written, so a rejected call changes nothing
-- (Redis does not roll back a script that fails half way). When the call makes the shard's
-- earliest due time earlier, it publishes that time on the shard's wake channel (include
-- `wake`): dispatchers in other processes look at the shard then.
-- @include int, wake, tags, keyed

-- int.lua: `int(s)`, the one check of an integer argument.
-- An include, not a script: a script that names it in its header (`-- @include int`)
-- gets it after its header (`engine::scripts::source`).

-- A canonical decimal integer within +-(2^53 - 1) (no spaces, exponents, hex, nan or inf,
-- nothing a double cannot hold exactly), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^-?[0-9]+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 or n < -9007199254740991 then return nil end
  return n
end

-- wake.lua: a shard's earliest due time and its cross-process wake-up.
-- An include, not a script: a script that names it in its header (`-- @include wake`)
-- gets it after its header (`engine::scripts::source`).

-- Cross-process wake-ups. `earliest(due)` is a shard's earliest due time (nil: none). After
-- a write that scheduled orders, the earliest of them due at `due_ms`, `wake(due, before,
-- due_ms)` publishes `due_ms` on the shard's wake channel (its due key with `wake` for
-- `due`: `{tag}:wake`) when it is earlier than the shard's earliest before the write:
-- every dispatcher of the queue listens there and looks at the shard then. Sharded
-- (`SPUBLISH`, Redis 7) where the server has it, `PUBLISH` on 6.2. Cost: O(1) + one
-- `ZRANGE 0 0`, O(log n), per call.
local function earliest(due)
  local f = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  return tonumber(f[2])
end
-- Publishes `msg` on the wake channel of the shard whose hash tag `key` carries
-- (`{tag}:...` -> `{tag}:wake`): an order's due time `<ms>` (for the dispatchers and the
-- waiting pull receives), or `t<ms>`, a group's timer (a pull consumer's retry, a replay:
-- for the waiting pull receives only; src/engine/listen.rs). A refused publish (no
-- SPUBLISH on 6.2; an ACL without the channel) never fails the write: the listeners'
-- fallback poll finds the work.
local function announce(key, msg)
  local channel = string.match(key, '^({[^}]*})') .. ':wake'
  local r = redis.pcall('SPUBLISH', channel, msg)
  if type(r) == 'table' and r.err then redis.pcall('PUBLISH', channel, msg) end
end
local function wake(due, before, due_ms)
  if due_ms and (not before or due_ms < before) then announce(due, due_ms) end
end

-- tags.lua: an order's tags in its stored value, and their index members.
-- An include, not a script: a script that names it in its header (`-- @include tags`)
-- gets it after its header (`engine::scripts::source`).

-- Tags (issue 43, src/engine/tags.rs). `tag_list(v)`: the tag list of a stored value or
-- payload argument, the text between its first two GS ("t1\31t2"), or false when it has
-- none (a raw GS only ever opens the list: ids, keys and tags forbid control characters and
-- a JSON text holds none). `each_tag(list, id, set, v)`: set[<tag>\31<id>] = v for each tag.
local function tag_list(v)
  if type(v) ~= 'string' then return false end
  local a = string.find(v, '\29', 1, true)
  if not a then return false end
  local b = string.find(v, '\29', a + 1, true)
  if not b or b == a + 1 then return false end
  return string.sub(v, a + 1, b - 1)
end
local function each_tag(list, id, set, v)
  for t in string.gmatch(list, '[^\31]+') do set[t .. '\31' .. id] = v end
end

-- keyed.lua: helpers of the scripts that keep a shard's key index (issue 42: enqueue,
-- dequeue, cancel, reschedule, tag_bulk). An include, not a script: a script that names it
-- in its header (`-- @include keyed`) gets it after its header (`engine::scripts::source`).
--
-- The index exists only while the shard holds keyed orders (the meta HASH's field `keys`
-- says it may): the key index ZSET `{tag}:keyed` holds one member per keyed scheduled
-- order, "<key>\31<due ms, 16 digits>\31<order id>", every score 0 (read by lex range: one
-- key's orders in due order); the key ring ZSET `{tag}:key_ring` holds each key that has
-- scheduled orders, scored by its earliest due time. An order's key is read from its stored
-- value ("<enqueued_ms>:[!<ms>!]\30<key>\30..."): keys hold no control character. While the
-- shard is marked, unkeyed orders written are indexed too, under the empty key "" (members
-- "\31<due>\31<id>"): the unkeyed orders are then one participant of the rotation like a
-- key; unkeyed orders written before the mark have no member (the dispatcher finds those
-- among the earliest due orders).

-- Zeros that pad a due time of `i` digits to the member's 16.
local KEY_PAD = {}
for i = 1, 16 do KEY_PAD[i] = string.rep('0', 16 - i) end

-- The index member of an order of `key` due at `due` (unix ms): a number, or a string of
-- decimal digits (a checked argument, a score Redis returned), which is padded, not
-- formatted (string.format costs about half a microsecond per order).
local function key_member(key, due, id)
  if type(due) == 'string' and #due <= 16 then return key .. '\31' .. KEY_PAD[#due] .. due .. '\31' .. id end
  return key .. '\31' .. string.format('%016d', due) .. '\31' .. id
end

-- The bound `key_range` takes for the members due by `now`: the member's fixed-width due
-- time of now + 1.
local function key_due_bound(now)
  return string.format('%016d', now + 1)
end

-- The lex bounds of `key`'s members: those due before `bound` (a `key_due_bound`), or all
-- of them when `bound` is nil. Keys hold no control character, so no other key's member
-- falls between them.
local function key_range(key, bound)
  if bound then return '[' .. key .. '\31', '(' .. key .. '\31' .. bound end
  return '[' .. key .. '\31', '(' .. key .. '\32'
end

-- A member's fixed-width due time and its order id, cut at its key's length `kl` (no
-- pattern: the dispatcher's loop over a backlog's members).
local function key_cut(m, kl)
  return string.sub(m, kl + 2, kl + 17), string.sub(m, kl + 19)
end

-- A member's key, due time and order id.
local function key_parse(m)
  local k, d, id = string.match(m, '^([^\31]*)\31(%d+)\31(.*)$')
  return k, tonumber(d), id
end

-- The key of a stored value, or nil.
local function stored_key(v)
  if not v then return nil end
  return string.match(v, '^%d+:\30([^\30]+)\30') or string.match(v, '^%d+:!%d+!\30([^\30]+)\30')
end

-- One key's index members in due order, from `offset`, at most `count`.
local function key_orders(kidx, key, offset, count)
  local lo, hi = key_range(key)
  return redis.call('ZRANGE', kidx, lo, hi, 'BYLEX', 'LIMIT', offset, count)
end

-- Sets `key`'s ring score to its earliest indexed order's due time (at least `floor` when
-- given: the dispatcher passes its now for the keys it served, so they queue behind the
-- keys it did not serve), or takes it off the ring.
local function key_refresh(kidx, kring, key, floor)
  local head = key_orders(kidx, key, 0, 1)[1]
  if head then
    local _, due = key_parse(head)
    if floor and floor > due then due = floor end
    redis.call('ZADD', kring, due, key)
  else
    redis.call('ZREM', kring, key)
  end
end

-- Takes a scheduled order's member out of the index (its due time `due`, its stored value
-- `v`; an unkeyed order's is under ""), refreshing its key's ring score; returns the key
-- when there was a member, nil otherwise (an unkeyed order written before the mark).
local function key_unindex(kidx, kring, id, due, v)
  local key = stored_key(v) or ''
  if not due then return nil end
  if redis.call('ZREM', kidx, key_member(key, due, id)) == 1 then
    key_refresh(kidx, kring, key)
    return key
  end
  return nil
end

if #KEYS ~= 10 then return redis.error_reply('ERR delayq enqueue: 10 KEYS expected') end
local mode, plus, colon, cols = string.match(ARGV[1], '^(%a+)(%+?%a*)(:?)([rk]*)$')
local tagged = plus == '+tags'
if plus ~= '' and not tagged then mode = nil end
if mode ~= 'upsert' and mode ~= 'nx' then
  return redis.error_reply('ERR delayq enqueue: mode must be upsert or nx')
end
local now = ARGV[2]
if not int(now) or int(now) < 0 then
  return redis.error_reply('ERR delayq enqueue: now must be unix milliseconds')
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq enqueue: the queue epoch is missing')
end
local given_epoch, given_rules = ARGV[3], nil
local cut = string.find(ARGV[3], '\31', 1, true)
if cut then
  given_epoch = string.sub(ARGV[3], 1, cut - 1)
  given_rules = string.sub(ARGV[3], cut + 1)
end
-- w: values per order; rcol, kcol: offsets of the rules and key columns in an order's values.
-- Without ":", the rules column alone.
if colon ~= ':' then cols = 'r' end
local w, rcol, kcol = 4, nil, nil
if string.find(cols, 'r', 1, true) then rcol = w; w = w + 1 end
if string.find(cols, 'k', 1, true) then kcol = w; w = w + 1 end
if (#ARGV - 3) % w ~= 0 then
  return redis.error_reply('ERR delayq enqueue: orders come as id, due_ms, payload' .. (w >= 5 and ', level and ' .. (w - 4) .. ' more values each' or ', level quadruples'))
end
local lanes = { [''] = '', normal = '', high = 'high', low = 'low' }
for i = 4, #ARGV, w do
  if ARGV[i] == '' then
    return redis.error_reply('ERR delayq enqueue: empty order id')
  end
  local due = int(ARGV[i + 1])
  if not due or due < 0 then
    return redis.error_reply('ERR delayq enqueue: due_ms of order ' .. ARGV[i] .. ' is not a number (a non-negative decimal integer)')
  end
  if not lanes[ARGV[i + 3]] then
    return redis.error_reply('ERR delayq enqueue: the level of order ' .. ARGV[i] .. ' must be high, normal or low')
  end
  local m = rcol and ARGV[i + rcol] ~= '' and string.match(ARGV[i + rcol], '^r?(.*)$') or ''
  if kcol and ARGV[i + kcol] ~= '' and (#ARGV[i + kcol] > 128 or string.find(ARGV[i + kcol], '%c')) then
    return redis.error_reply('ERR delayq enqueue: the key of order ' .. ARGV[i] .. ' must be 1..128 bytes without control characters')
  end
  if m ~= '' then
    if not int(m) or int(m) < 1 then
      return redis.error_reply('ERR delayq enqueue: the debounce max_wait of order ' .. ARGV[i] .. ' must be a positive number of ms')
    end
    if mode == 'nx' then
      return redis.error_reply('ERR delayq enqueue: debounce (order ' .. ARGV[i] .. ') cannot go with nx')
    end
  end
end

local meta = redis.call('HMGET', KEYS[3], 'epoch', 'dedup_ms', 'debounce', 'tags', 'keys', 'cancel_on')
local epoch, window = meta[1], tonumber(meta[2] or '0') or 0
if not epoch then
  return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
end
if epoch ~= given_epoch then
  return redis.error_reply('ERR delayq stale_epoch: the queue was deleted and created again')
end
if meta[6] and not given_rules then
  return redis.error_reply('ERR delayq enqueue: the queue has cancel_on rules and this producer does not compute their match tokens: upgrade it')
end
-- While the rules change, the meta hash holds "<old>|<new>" and either version is accepted.
if given_rules and given_rules ~= (meta[6] or '')
    and not string.find('|' .. (meta[6] or '') .. '|', '|' .. given_rules .. '|', 1, true) then
  return redis.error_reply('ERR delayq stale_epoch: the queue\'s cancel_on rules changed')
end

-- Which ids are known before the call: one ZMSCORE per 1,000 ids, then one ZADD and one
-- HSET per 500 orders instead of one of each per order (a call from Lua costs more than the
-- work it does for one order). An id given twice in one call behaves as two calls in order:
-- the later one is an update (upsert) or unchanged (nx).
local n = (#ARGV - 3) / w
local ids = {}
for k = 1, n do ids[k] = ARGV[w * (k - 1) + 4] end
local known = {}
for s = 1, n, 1000 do
  local e = math.min(s + 999, n)
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids, s, e))
  for k = s, e do known[k] = scores[k - s + 1] end
end
-- Dedup window: an id not waiting whose last dispatch is within the window is a duplicate.
local dup = {}
if window > 0 then
  for s = 1, n, 1000 do
    local e = math.min(s + 999, n)
    local at = redis.call('ZMSCORE', KEYS[5], unpack(ids, s, e))
    for k = s, e do
      local d = tonumber(at[k - s + 1])
      local again = rcol and string.sub(ARGV[w * (k - 1) + 4 + rcol], 1, 1) == 'r'
      if d and not known[k] and not again and d >= tonumber(now) - window then dup[k] = d end
    end
  end
end
-- Events: a new order with a match token remembered until later than now is answered
-- { 4, token } and not written.
local ev = {}
if tagged then
  local toks, at = {}, {}
  for k = 1, n do
    local p = ARGV[w * (k - 1) + 6]
    if not known[k] and string.find(p, '\29\1', 1, true) then
      local list = tag_list(p)
      if list then
        for t in string.gmatch(list, '[^\31]+') do
          if string.byte(t, 1) == 1 then toks[#toks + 1] = t; at[#toks] = k end
        end
      end
    end
  end
  for s = 1, #toks, 1000 do
    local e = math.min(s + 999, #toks)
    local until_ms = redis.call('ZMSCORE', KEYS[10], unpack(toks, s, e))
    for j = s, e do
      local u = tonumber(until_ms[j - s + 1])
      if u and u > tonumber(now) and not ev[at[j]] then ev[at[j]] = toks[j] end
    end
  end
end
-- Debounce (quintuples only): the records of the debounced orders that are waiting.
local deb, rec = {}, {}
if rcol then
  local want, at = {}, {}
  for k = 1, n do
    local r = ARGV[w * (k - 1) + 4 + rcol]
    if known[k] and r ~= '' and string.match(r, '%d') then want[#want + 1] = ids[k]; at[#want] = k end
  end
  for s = 1, #want, 1000 do
    local got = redis.call('HMGET', KEYS[7], unpack(want, s, math.min(s + 999, #want)))
    for j = 1, #got do rec[at[s + j - 1]] = got[j] end
  end
end
-- The stored values of the known ids an upsert may replace, while the shard has had tagged
-- orders (their old tags leave the index) or keyed ones (their old key members move).
local old = {}
if (meta[4] or meta[5]) and mode == 'upsert' then
  local want, at = {}, {}
  for k = 1, n do
    if known[k] and not dup[k] then want[#want + 1] = ids[k]; at[#want] = k end
  end
  for s = 1, #want, 1000 do
    local got = redis.call('HMGET', KEYS[2], unpack(want, s, math.min(s + 999, #want)))
    for j = 1, #got do old[at[s + j - 1]] = got[j] end
  end
end
-- Keys: the index members the known ids have before the call (a shard with `keys` only).
local kmember = {}
if meta[5] and mode == 'upsert' then
  local maybe, mat = {}, {}
  for k = 1, n do
    if known[k] and not dup[k] then
      local key = stored_key(old[k])
      if key then
        kmember[ids[k]] = key_member(key, known[k], ids[k])
      else
        -- Unkeyed: indexed under "" when it was written while the shard was marked.
        maybe[#maybe + 1] = key_member('', known[k], ids[k]); mat[#maybe] = ids[k]
      end
    end
  end
  for s = 1, #maybe, 1000 do
    local e = math.min(s + 999, #maybe)
    local there = redis.call('ZMSCORE', KEYS[8], unpack(maybe, s, e))
    for m = s, e do
      if there[m - s + 1] then kmember[mat[m]] = maybe[m] end
    end
  end
end
-- Keys: the index members to add ('0', member pairs) and the ring's (due, key) pairs, at
-- the same positions (`na` of each); the members they replace. An id's position is kept
-- in `seen` (a number), so an id written again in this call replaces its pair in place:
-- a new order costs its member and four stores, no table keyed by id.
local added, lower, na, replaced = {}, {}, 0, {}
-- Levels: "high"/"low" set in the levels HASH, normal ones removed from
-- it (the last one given wins, as for the payload); a queue that never used a level has no
-- levels HASH and pays one EXISTS per call.
local seen, z, h, fin, out = {}, {}, {}, {}, {}
-- Tags: per id written, its latest list (false: none); per index member, whether it ends
-- up in the index (in call order: an upsert keeping a tag removes and adds it).
local cur, fate = {}, {}
local had_levels = redis.call('EXISTS', KEYS[4]) == 1
for k = 1, n do
  local id = ids[k]
  local exists = known[k] or seen[id]
  local a = w * (k - 1) + 4
  if dup[k] and not seen[id] then
    out[k] = { 3, dup[k] }
  elseif ev[k] and not seen[id] then
    out[k] = { 4, ev[k] }
  elseif mode == 'nx' and exists then
    out[k] = 0
  else
    if exists then out[k] = 2 else out[k] = 1 end
    local prior = seen[id]
    seen[id] = true
    local due = ARGV[a + 1]
    local max_wait = rcol and ARGV[a + rcol] ~= '' and string.match(ARGV[a + rcol], '%d+')
    if max_wait then
      local r = deb[id] or (exists and rec[k]) or nil
      local first, cap = string.match(r or '', '^(%d+):(%d+)$')
      if not first then first, cap = now, string.format('%d', tonumber(now) + tonumber(max_wait)) end
      if tonumber(due) > tonumber(cap) then due = cap end
      deb[id] = first .. ':' .. cap
      out[k] = { out[k], tonumber(due) }
    end
    z[#z + 1] = due
    z[#z + 1] = id
    if kcol or meta[5] then
      -- Indexed, an unkeyed order under "" (see keyed.lua).
      local key = kcol and ARGV[a + kcol] or ''
      local new = key_member(key, due, id)
      if type(prior) == 'number' then
        -- Written earlier in this call: that member never reached the index.
        added[prior], lower[prior - 1], lower[prior] = new, due, key
        seen[id] = prior
      else
        -- Its member before the call (a known id's), unless it stays the same.
        local was = kmember[id]
        if was ~= new then
          if was then replaced[#replaced + 1] = was end
          na = na + 2
          added[na - 1], added[na], lower[na - 1], lower[na] = '0', new, due, key
          seen[id] = na
        end
      end
    end
    h[#h + 1] = id
    h[#h + 1] = now .. ':' .. ARGV[a + 2]
    if tagged or meta[4] then
      -- The set it had (an earlier order of this call, else the stored value) leaves the
      -- index, the new one enters it.
      local before_list = cur[id]
      if before_list == nil then before_list = (exists and tag_list(old[k])) or false end
      local list = tagged and tag_list(ARGV[a + 2]) or false
      if before_list then each_tag(before_list, id, fate, false) end
      if list then each_tag(list, id, fate, true) end
      cur[id] = list
    end
    local level = lanes[ARGV[a + 3]]
    if level ~= '' or had_levels or fin[id] then fin[id] = level end
  end
end
local before, first = earliest(KEYS[1]), nil
for s = 1, #z, 2 do first = math.min(first or math.huge, tonumber(z[s])) end
for s = 1, #z, 1000 do
  redis.call('ZADD', KEYS[1], unpack(z, s, math.min(s + 999, #z)))
  redis.call('HSET', KEYS[2], unpack(h, s, math.min(s + 999, #h)))
end
if rcol then
  local set = {}
  for id, r in pairs(deb) do set[#set + 1] = id; set[#set + 1] = r end
  for s = 1, #set, 1000 do redis.call('HSET', KEYS[7], unpack(set, s, math.min(s + 999, #set))) end
  if #set > 0 and not meta[3] then redis.call('HSET', KEYS[3], 'debounce', '1') end
end
local lv, plain = {}, {}
for id, level in pairs(fin) do
  if level ~= '' then
    lv[#lv + 1] = id
    lv[#lv + 1] = level
  elseif had_levels then
    plain[#plain + 1] = id
  end
end
for s = 1, #plain, 1000 do
  redis.call('HDEL', KEYS[4], unpack(plain, s, math.min(s + 999, #plain)))
end
for s = 1, #lv, 1000 do
  redis.call('HSET', KEYS[4], unpack(lv, s, math.min(s + 999, #lv)))
end
if tagged or meta[4] then
  local rm, zs = {}, {}
  for m, keep in pairs(fate) do
    if keep then zs[#zs + 1] = '0'; zs[#zs + 1] = m else rm[#rm + 1] = m end
  end
  for s = 1, #rm, 1000 do redis.call('ZREM', KEYS[6], unpack(rm, s, math.min(s + 999, #rm))) end
  for s = 1, #zs, 1000 do redis.call('ZADD', KEYS[6], unpack(zs, s, math.min(s + 999, #zs))) end
  if #zs > 0 and not meta[4] then redis.call('HSET', KEYS[3], 'tags', '1') end
end
-- Keys: each written order's old member out, its new one in; the ring follows: one
-- (due, key) pair per new member in a ZADD LT, which keeps each key's earliest (Redis
-- does that per pair for less than a Lua table by key would cost; the due times stay the
-- caller's strings), then the keys that lost a member are scored afresh.
local gone = {}
for s = 1, #replaced, 1000 do
  redis.call('ZREM', KEYS[8], unpack(replaced, s, math.min(s + 999, #replaced)))
end
for _, was in ipairs(replaced) do gone[key_parse(was)] = true end
for s = 1, na, 1000 do redis.call('ZADD', KEYS[8], unpack(added, s, math.min(s + 999, na))) end
for s = 1, na, 1000 do redis.call('ZADD', KEYS[9], 'LT', unpack(lower, s, math.min(s + 999, na))) end
for key in pairs(gone) do key_refresh(KEYS[8], KEYS[9], key) end
if na > 0 and not meta[5] then redis.call('HSET', KEYS[3], 'keys', '1') end
wake(KEYS[1], before, first)
return out
