-- cancel.lua: remove one scheduled order (schedule entry, payload and level together) and
-- record the cancellation in the order history.
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  the shard's levels HASH (see enqueue.lua)
-- KEYS[4]  the shard's debounce HASH (see enqueue.lua)
-- KEYS[5]  the shard's tag index ZSET (see enqueue.lua)
-- KEYS[6]  the shard's key index ZSET, KEYS[7] its key ring ZSET (issue 42; see keyed.lua):
--          a keyed order's member goes with it
-- KEYS[8]  the shard's history bucket of now ({ns:q:s}:history:<bucket ms>:<bucket>, as
--          dequeue.lua's KEYS[4]; untouched while history is off)
--          Always all 8 KEYS (one arity; any other count is refused).
-- ARGV[1]  order id
-- ARGV[2]  optional: when the history bucket expires, unix ms (0 or absent: history off,
--          nothing recorded; src/engine/history.rs `write_target`)
-- ARGV[3]  with ARGV[2] > 0: now, unix ms (the client's Redis clock)
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).
-- Why one script: the three go together, so no crash leaves a payload or level without its
-- schedule entry, nor an index member without its order; the history record
-- "c:<now>:<due>:id" (include `unschedule`) is written in the same step, so the history
-- answers `cancelled` exactly for the orders cancelled. Arguments are checked before the
-- first write. Cost: O(log N) in the shard's scheduled orders (ZSCORE, ZREM), + O(t log T)
-- for t tags in an index of T members, one EXISTS (KEYS[7]), and while the shard has keyed
-- orders O(log K) in the key index; with history one HSET and one PEXPIREAT.
-- Redis >= 6.2.
-- @include unschedule

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

if #KEYS ~= 8 then return redis.error_reply('ERR delayq cancel: 8 KEYS expected') end
local at, now = history_args(ARGV[2], ARGV[3], 'id')
if not at then return redis.error_reply('ERR delayq cancel: ' .. now) end
local keyed = redis.call('EXISTS', KEYS[7]) == 1
local due = unschedule({ due = KEYS[1], payload = KEYS[2], levels = KEYS[3],
  debounce = KEYS[4], tags = KEYS[5], kidx = KEYS[6], kring = KEYS[7] }, ARGV[1], keyed, nil)
if not due then return 0 end
write_cancels(KEYS[8], at, { ARGV[1], cancel_record(now, due, 'id') })
return 1
