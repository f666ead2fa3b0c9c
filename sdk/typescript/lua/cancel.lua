-- cancel.lua: remove one scheduled order (schedule entry, payload and level together).
--
-- KEYS[1]  the shard's due ZSET
-- KEYS[2]  the shard's payload HASH
-- KEYS[3]  optional: the shard's levels HASH (see enqueue.lua)
-- KEYS[4]  optional: the shard's debounce HASH (see enqueue.lua)
-- KEYS[5]  optional (with KEYS[4]): the shard's tag index ZSET (see enqueue.lua)
-- KEYS[6]  optional (with KEYS[5]): the shard's key index ZSET, KEYS[7] its key ring ZSET
--          (issue 42; see keyed.lua): a keyed order's member goes with it
-- ARGV[1]  order id
--
-- Returns: 1 = cancelled, 0 = not found (never scheduled, or already dispatched).
-- Why one script: the three go together, so no crash leaves a payload or level without its
-- schedule entry, nor an index member without its order. With the tag index, the value is
-- read before it is deleted (HGET: its tags leave the index). Cost: O(log N) in the shard's
-- scheduled orders (ZREM), + O(t log T) for t tags in an index of T members; with KEYS[7]
-- one EXISTS more, and while the shard has keyed orders a ZSCORE and O(log K) in the key
-- index. Redis >= 6.2.
-- @include tags, keyed

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
-- The index exists only while the shard holds keyed orders (the marker HASH's field `keys`
-- says it may): the key index ZSET `{tag}:keyed` holds one member per keyed scheduled
-- order, "<key>\31<due ms, 16 digits>\31<order id>", every score 0 (read by lex range: one
-- key's orders in due order); the key ring ZSET `{tag}:key_ring` holds each key that has
-- scheduled orders, scored by its earliest due time. An order's key is read from its stored
-- value ("<enqueued_ms>:[!<ms>!]\30<key>\30..."): keys hold no control character. While the
-- shard is marked, unkeyed orders written are indexed too, under the empty key "" (members
-- "\31<due>\31<id>"): the unkeyed orders are then one participant of the rotation like a
-- key; unkeyed orders written before the mark have no member (the dispatcher finds those
-- among the earliest due orders).

-- The index member of an order of `key` due at `due` (unix ms).
local function key_member(key, due, id)
  return key .. '\31' .. string.format('%016d', due) .. '\31' .. id
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
  return redis.call('ZRANGE', kidx, '[' .. key .. '\31', '(' .. key .. '\32', 'BYLEX', 'LIMIT', offset, count)
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

local value = nil
if KEYS[5] then value = redis.call('HGET', KEYS[2], ARGV[1]) end
if KEYS[7] and redis.call('EXISTS', KEYS[7]) == 1 then
  local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
  key_unindex(KEYS[6], KEYS[7], ARGV[1], tonumber(due), value)
end
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 and KEYS[5] then
  local list = tag_list(value)
  if list then
    local members, rm = {}, {}
    each_tag(list, ARGV[1], members, true)
    for m in pairs(members) do rm[#rm + 1] = m end
    redis.call('ZREM', KEYS[5], unpack(rm))
  end
end
redis.call('HDEL', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('HDEL', KEYS[3], ARGV[1]) end
if KEYS[4] then redis.call('HDEL', KEYS[4], ARGV[1]) end
return removed
