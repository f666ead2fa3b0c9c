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
