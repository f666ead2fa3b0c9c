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
if #KEYS ~= 8 then return redis.error_reply('ERR delayq cancel: 8 KEYS expected') end
local at, now = history_args(ARGV[2], ARGV[3], 'id')
if not at then return redis.error_reply('ERR delayq cancel: ' .. now) end
local keyed = redis.call('EXISTS', KEYS[7]) == 1
local due = unschedule({ due = KEYS[1], payload = KEYS[2], levels = KEYS[3],
  debounce = KEYS[4], tags = KEYS[5], kidx = KEYS[6], kring = KEYS[7] }, ARGV[1], keyed, nil)
if not due then return 0 end
write_cancels(KEYS[8], at, { ARGV[1], cancel_record(now, due, 'id') })
return 1
