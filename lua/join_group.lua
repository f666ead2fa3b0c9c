-- join_group.lua: create a consumer group on a shard's stream, only when it is new.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the shard's meta HASH (field epoch while the queue exists)
-- ARGV[1]  group
-- ARGV[2]  "create" (a worker starting: create the group if absent) or "rejoin" (a running
--          worker whose read found no group: never create it again over an existing stream)
--          or "lane" (KEYS[1] is a high or low priority lane: create the group, from the
--          start, only where the lane's stream exists; dequeue.lua makes a lane with every
--          group of the normal stream, so this covers groups that joined later)
-- ARGV[3]  the most groups a queue may have
--
-- Returns: 1 = created (reading from the start of the stream), 0 = it existed.
-- Errors (nothing written): "ERR delayq queue_not_found ..." (the queue was deleted),
-- "ERR delayq group_deleted ..." (rejoin: the stream exists without the group, so it was
-- deleted on purpose; creating it again from the start would deliver every retained entry
-- once more), "ERR delayq too_many_groups ..." (the cap is reached).
--
-- Why one script: the checks and XGROUP CREATE happen together, so a group is created from
-- the start of the stream only when it is new, and never in a queue being deleted.
-- Cost: O(groups) (XINFO GROUPS on each lane). Redis >= 6.2.
-- @include int, groups
local max = int(ARGV[3])
if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR delayq join_group: the group name is missing')
end
if ARGV[2] ~= 'create' and ARGV[2] ~= 'rejoin' and ARGV[2] ~= 'lane' then
  return redis.error_reply('ERR delayq join_group: mode must be create, rejoin or lane')
end
if not max or max < 1 then
  return redis.error_reply('ERR delayq join_group: the cap on groups must be at least 1')
end
if redis.call('HEXISTS', KEYS[2], 'epoch') == 0 then
  return redis.error_reply('ERR delayq queue_not_found: the queue does not exist')
end
if ARGV[2] == 'lane' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  for _, name in ipairs(group_names(KEYS[1])) do
    if name == ARGV[1] then return 0 end
  end
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local groups = groups_of(KEYS[1])
  for _, g in ipairs(groups) do
    if g['name'] == ARGV[1] then return 0 end
  end
  if ARGV[2] == 'rejoin' then
    return redis.error_reply('ERR delayq group_deleted: the group was deleted')
  end
  if #groups >= max then
    return redis.error_reply('ERR delayq too_many_groups: the queue has ' .. max .. ' groups')
  end
end
redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
return 1
