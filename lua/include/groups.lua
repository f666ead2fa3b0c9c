-- groups.lua: a stream's consumer groups and consumers (XINFO).
-- An include, not a script: a script that names it in its header (`-- @include groups`)
-- gets it after its header (`engine::scripts::source`).

-- An XINFO reply's flat list of fields and values as a table (a nil value reads as false).
local function info_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The consumer groups of a stream, each as a table of its XINFO GROUPS fields (name,
-- consumers, pending, last-delivered-id; entries-read and lag from Redis 7.0); none when
-- the stream does not exist.
local function groups_of(stream)
  local out = {}
  if redis.call('EXISTS', stream) == 0 then return out end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do out[#out + 1] = info_table(g) end
  return out
end

-- The consumers of one group of a stream, each as a table of its XINFO CONSUMERS fields
-- (name, pending, idle).
local function consumers_of(stream, group)
  local out = {}
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
    out[#out + 1] = info_table(c)
  end
  return out
end

-- The names of a stream's consumer groups (none when the stream does not exist).
local function group_names(stream)
  local names = {}
  for _, g in ipairs(groups_of(stream)) do names[#names + 1] = g['name'] end
  return names
end
