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
