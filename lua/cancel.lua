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
