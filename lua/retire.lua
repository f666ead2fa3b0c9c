-- retire.lua: the registry's side of deleting a queue: mark its record "deleting" (begin),
-- then, once every shard's keys are gone, remove the record (end).
--
-- KEYS[1]  the namespace's SET of queue names        ({ns}:queues)
-- KEYS[2]  the queue's registry record HASH           ({ns}:queue:<q>)
-- KEYS[3]  the registry's version counter STRING      ({ns}:registry:version)
-- KEYS[4]  the SET of queues being deleted            ({ns}:deleting)
-- ARGV[1]  "begin" or "end"
-- ARGV[2]  the queue name
-- ARGV[3]  begin: now, unix ms (when the delete started); end: the epoch being deleted
--
-- Returns:
--   begin: { 0 } when the queue is not registered; else { 1, shards, epoch }: the record is
--          now marked deleting (field "deleting" = the start time; already marked: left as
--          it is, so a repeated delete resumes the first one), its name is out of the
--          listing and in the deleting SET, and the version is bumped (supervisors stop
--          its dispatchers). A marked record refuses creates until its end (create_queue.lua
--          finishes the delete first), and lookups treat it as absent.
--   end:   1 when the record (marked deleting, with that epoch) was removed, 0 when there
--          was nothing to remove (another process ended it, or it is not this epoch's).
-- Error "ERR delayq retire: ..." on a bad argument (nothing written).
--
-- Why one script: the mark, the listing and the version change together, so no process
-- sees a queue listed but deleting, or a record gone while its keys remain unlisted
-- anywhere (the deleting SET is where the housekeeper finds an unfinished delete).
-- Cost: O(1). Redis >= 6.2.
-- @include int
local mode, name = ARGV[1], ARGV[2]
if mode ~= 'begin' and mode ~= 'end' then
  return redis.error_reply('ERR delayq retire: mode must be begin or end')
end
if type(name) ~= 'string' or name == '' then
  return redis.error_reply('ERR delayq retire: the queue name is missing')
end
if type(ARGV[3]) ~= 'string' or ARGV[3] == '' then
  return redis.error_reply('ERR delayq retire: the start time or epoch is missing')
end
if mode == 'begin' then
  if not int(ARGV[3]) then
    return redis.error_reply('ERR delayq retire: now must be unix milliseconds')
  end
  local rec = redis.call('HMGET', KEYS[2], 'shards', 'epoch', 'deleting')
  if not rec[1] or not rec[2] then return { 0 } end
  if not rec[3] then
    redis.call('HSET', KEYS[2], 'deleting', ARGV[3])
  end
  redis.call('SREM', KEYS[1], name)
  redis.call('SADD', KEYS[4], name)
  redis.call('INCR', KEYS[3])
  return { 1, tonumber(rec[1]), rec[2] }
end
local rec = redis.call('HMGET', KEYS[2], 'epoch', 'deleting')
if rec[2] and rec[1] == ARGV[3] then
  redis.call('DEL', KEYS[2])
  redis.call('SREM', KEYS[4], name)
  redis.call('INCR', KEYS[3])
  return 1
end
if not rec[2] then redis.call('SREM', KEYS[4], name) end
return 0
