-- tag_bulk.lua: cancel or move a bounded batch of one shard's orders that carry a tag
-- (issue 43; src/engine/tags.rs). The caller loops, passing the last id back, until the
-- reply says no more remain.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  the shard's levels HASH (see enqueue.lua)
-- KEYS[4]  the shard's debounce HASH (see enqueue.lua)
-- KEYS[5]  the shard's tag index ZSET (score 0, member "<tag>\x1f<id>"; enqueue.lua)
-- KEYS[6]  the shard's key index ZSET, KEYS[7] its key ring ZSET (issue 42; see keyed.lua):
--          a keyed order's member goes or moves with it
-- KEYS[8]  the shard's history bucket of now ({ns:q:s}:history:<bucket ms>:<bucket>, as
--          dequeue.lua's KEYS[4]; untouched by a move and while history is off)
--          Always all 8 KEYS (one arity; any other count is refused).
-- ARGV[1]  the tag (1..=128 bytes, no control characters: checked by the caller), or a
--          cancel-on-event match token (\x01 then no control characters)
-- ARGV[2]  at most this many orders, 1..1000
-- ARGV[3]  the action: "cancel", "at" (a new due time, ARGV[4] unix ms) or "shift" (the due
--          time moved by ARGV[4] ms, negative or positive; not below 0)
-- ARGV[4]  the due time or shift for "at" / "shift" ("" for cancel)
-- ARGV[5]  the cursor: "" for the start, else the last id a previous call answered (the ids
--          are worked in byte order)
-- ARGV[6]  optional, cancel only: when the history bucket expires, unix ms (0 or absent:
--          history off, nothing recorded; src/engine/history.rs `write_target`)
-- ARGV[7]  with ARGV[6] > 0: now, unix ms (the client's Redis clock)
-- ARGV[8]  with ARGV[6] > 0: the reason recorded, "tag\31<tag>" or "event\31<name>\31<event
--          id or empty>" (include `unschedule`, `cancel_record`)
--
-- Returns: { affected, last_id or false, more }: how many orders were cancelled or moved,
--          the last id looked at (the next call's cursor), more = 1 when ids of the tag
--          remain after it. A member whose order is no longer scheduled (never happens
--          while every writer keeps the index; a foreign writer's leftovers) is dropped
--          and not counted. A repeated cancel answers 0.
-- Why one script: each order is cancelled exactly as cancel.lua does (the shared include
-- `unschedule`: schedule entry, payload, level, debounce record and every index member of
-- it together, and its history record "c:<now>:<due>:<reason>" in the same step) or moved as
-- reschedule.lua does, in one step with the index read, so against dequeue.lua (which
-- takes an order and its index members in one step) an order is either cancelled here or
-- dispatched there, never both and never neither. Every argument is checked before the
-- first write. A move before the shard's earliest due time is published on its wake
-- channel (include `wake`).
-- Cost: O(m (log N + t log T)) for m <= ARGV[2] orders of t tags each, N scheduled orders
-- and T index members; bounded by ARGV[2] (the caller keeps a call short: a few hundred);
-- one EXISTS (KEYS[7]), and while the shard has keyed orders O(log K) per order in the key
-- index; a cancel with history adds one HSET of the batch's records and one
-- PEXPIREAT per call.
-- Redis >= 6.2.
-- @include int, wake, keyed, unschedule

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

-- unschedule.lua: the removal of one scheduled order and its history record, shared by
-- the scripts that cancel (cancel.lua by id, tag_bulk.lua by tag or event).
-- An include, not a script: a script that names it in its header (`-- @include unschedule`)
-- gets it after its header (`engine::scripts::source`).
-- @include tags, keyed

-- `unschedule(k, id, keyed, member)`: removes order `id` from a shard: its schedule entry,
-- payload, level and debounce record, its tag index members and (`keyed`: the shard has
-- keyed orders) its key index member, all together. `k` holds the shard's keys (every one
-- given: the callers take one KEYS arity): due, payload, levels, debounce, tags, kidx,
-- kring. `member`: one more tag index member to drop (the one a bulk call read), gone
-- whether or not the order was scheduled. Returns
-- the order's due score (the string ZSCORE gave) when it was scheduled, else false; the
-- payload, level and debounce fields are deleted either way (an unscheduled id's leftovers).
-- Cost: ZSCORE + ZREM, O(log N); one HGET and O(t log T) for t tags in an index of T
-- members; keyed: O(log K) in the key index.
local function unschedule(k, id, keyed, member)
  local value = redis.call('HGET', k.payload, id)
  local due = redis.call('ZSCORE', k.due, id)
  if due and keyed then key_unindex(k.kidx, k.kring, id, tonumber(due), value) end
  local removed = due and redis.call('ZREM', k.due, id) == 1
  local members, rm = {}, {}
  if member then members[member] = true end
  if removed then
    local list = tag_list(value)
    if list then each_tag(list, id, members, true) end
  end
  for m in pairs(members) do rm[#rm + 1] = m end
  if #rm > 0 then redis.call('ZREM', k.tags, unpack(rm)) end
  if removed or not member then
    redis.call('HDEL', k.payload, id)
    redis.call('HDEL', k.levels, id)
    redis.call('HDEL', k.debounce, id)
  end
  if removed then return due end
  return false
end

-- The history record of an order cancelled at `now` (unix ms) that was due at `due` (its
-- ZSCORE string), for `reason`: "id", "tag\31<tag>" or "event\31<name>\31<event id or
-- empty>" (src/engine/history.rs reads it: `CancelledBy`). A dispatch record starts with
-- a stream id ("<ms>-<seq>:"), this one with "c:", so neither reads as the other.
local function cancel_record(now, due, reason)
  return 'c:' .. now .. ':' .. due .. ':' .. reason
end

-- `history_args(expiry, now, reason)`: checks the history arguments of a cancelling script
-- (expiry: unix ms, 0 = history off; now: unix ms; reason as `cancel_record`'s, no other
-- control character than its separators); returns expiry and now (its text) or nil and the
-- error text.
local function history_args(expiry, now, reason)
  local at = tonumber(expiry or '0')
  if not at or at < 0 or at % 1 ~= 0 then
    return nil, 'the history expiry must be unix milliseconds or 0'
  end
  if at == 0 then return 0, '0' end
  if type(now) ~= 'string' or not string.match(now, '^%d+$') then
    return nil, 'now must be unix milliseconds'
  end
  if at > 0 and (type(reason) ~= 'string' or not (reason == 'id'
      or string.match(reason, '^tag\31[^%z\1-\31]+$')
      or string.match(reason, '^event\31[^%z\1-\31]+\31[^%z\1-\31]*$'))) then
    return nil, 'the cancel reason must be id, tag<US><tag> or event<US><name><US><id>'
  end
  return at, now
end

-- `write_cancels(key, at, fields)`: writes the records `fields` (id, record, ...) into the
-- history bucket `key`, which expires at `at` (0: history off, nothing written), as
-- dequeue.lua writes a dispatch's. Cost: one HSET of the fields and one PEXPIREAT.
local function write_cancels(key, at, fields)
  if at > 0 and #fields > 0 then
    redis.call('HSET', key, unpack(fields))
    redis.call('PEXPIREAT', key, at)
  end
end

if #KEYS ~= 8 then return redis.error_reply('ERR delayq tag_bulk: 8 KEYS expected') end
local tag = ARGV[1]
local limit = int(ARGV[2])
local action = ARGV[3]
-- A cancel-on-event match token (src/engine/events.rs) is a tag whose first byte is \1.
local body = tag
if type(tag) == 'string' and string.byte(tag, 1) == 1 then body = string.sub(tag, 2) end
if type(tag) ~= 'string' or body == '' or string.find(body, '[%z\1-\31]') then
  return redis.error_reply('ERR delayq tag_bulk: the tag must be 1..128 bytes without control characters')
end
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR delayq tag_bulk: limit must be 1..1000')
end
local arg = nil
if action == 'at' or action == 'shift' then
  arg = int(ARGV[4])
  if not arg or (action == 'at' and arg < 0) then
    return redis.error_reply('ERR delayq tag_bulk: ' .. action .. ' needs a number of ms')
  end
elseif action ~= 'cancel' then
  return redis.error_reply('ERR delayq tag_bulk: the action must be cancel, at or shift')
end
local hist_at, now = 0, '0'
if action == 'cancel' then
  hist_at, now = history_args(ARGV[6], ARGV[7], ARGV[8])
  if not hist_at then return redis.error_reply('ERR delayq tag_bulk: ' .. now) end
end
local cursor = ARGV[5] or ''
local prefix = tag .. '\31'
local from = cursor == '' and ('[' .. prefix) or ('(' .. prefix .. cursor)
local got = redis.call('ZRANGEBYLEX', KEYS[5], from, '(' .. tag .. ' ', 'LIMIT', 0, limit + 1)
local more = 0
if #got > limit then more = 1; got[#got] = nil end
local affected, last, before, first = 0, false, nil, nil
if action ~= 'cancel' and #got > 0 then before = earliest(KEYS[1]) end
local keyed = #got > 0 and redis.call('EXISTS', KEYS[7]) == 1
local shard = { due = KEYS[1], payload = KEYS[2], levels = KEYS[3], debounce = KEYS[4],
  tags = KEYS[5], kidx = KEYS[6], kring = KEYS[7] }
local hist = {}
for i = 1, #got do
  local id = string.sub(got[i], #prefix + 1)
  last = id
  if action == 'cancel' then
    local due = unschedule(shard, id, keyed, got[i])
    if due then
      affected = affected + 1
      if hist_at > 0 then
        hist[#hist + 1] = id
        hist[#hist + 1] = cancel_record(now, due, ARGV[8])
      end
    end
  else
    local score = redis.call('ZSCORE', KEYS[1], id)
    if score then
      local due = arg
      if action == 'shift' then due = math.max(0, tonumber(score) + arg) end
      redis.call('ZADD', KEYS[1], 'XX', due, id)
      if keyed then
        local key = key_unindex(KEYS[6], KEYS[7], id, tonumber(score), redis.call('HGET', KEYS[2], id))
        if key then
          redis.call('ZADD', KEYS[6], 0, key_member(key, due, id))
          key_refresh(KEYS[6], KEYS[7], key)
        end
      end
      first = math.min(first or due, due)
      affected = affected + 1
    else
      redis.call('ZREM', KEYS[5], got[i])
    end
  end
end
if first then wake(KEYS[1], before, first) end
write_cancels(KEYS[8], hist_at, hist)
return { affected, last, more }
