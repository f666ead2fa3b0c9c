-- purge.lua: the last step of deleting a queue, one shard at a time: unlink every key of
-- the shard, unless the shard already belongs to a queue created again since.
--
-- KEYS[1]  the shard's meta HASH (field epoch)
-- KEYS[2 ..]  every other key of the shard: schedule, payloads, levels, streams, dead
--          letters, ticks, each group's timers and errors, rate limits and heartbeats
--          (shard 0), history buckets
-- ARGV[1]  the epoch being deleted
--
-- Returns 1 when the keys were unlinked (the meta hash had this epoch or none: fenced by
-- fence.lua), -1 when the meta hash holds another epoch (the queue was deleted and created
-- again: its shard is left alone).
--
-- Why one script: the epoch check and the unlink are one step, so a create that writes a
-- new epoch into the shard is either before it (left alone) or after it (starting empty).
-- UNLINK frees a large value in a background thread: the call costs O(keys), never
-- O(orders). Cost: O(number of KEYS). Redis >= 6.2.
if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR delayq purge: the epoch is missing')
end
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and epoch ~= ARGV[1] then return -1 end
for i = 1, #KEYS, 500 do
  redis.call('UNLINK', unpack(KEYS, i, math.min(i + 499, #KEYS)))
end
return 1
