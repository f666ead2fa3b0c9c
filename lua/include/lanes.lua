-- lanes.lua: opening a shard's priority lane with the groups of its normal lane.
-- @include groups
-- An include, not a script: a script that names it in its header (`-- @include lanes`)
-- gets it after its header (`engine::scripts::source`).

-- Opens a priority lane of a shard, once: makes its stream with every consumer group the
-- shard's normal stream has (each reading from the start of the lane) and sets the lane's
-- flag (a field of the shard's meta HASH), from which readers learn that it is in use.
local function open_lane(lane, normal, meta, flag)
  if redis.call('EXISTS', lane) == 1 then return end
  for _, g in ipairs(group_names(normal)) do
    redis.call('XGROUP', 'CREATE', lane, g, '0', 'MKSTREAM')
  end
  redis.call('HSET', meta, flag, '1')
end
