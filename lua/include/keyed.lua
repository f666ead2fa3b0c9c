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
