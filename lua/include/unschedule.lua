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
