-- stream_ids.lua: stream ids as numbers, and their order.
-- An include, not a script: a script that names it in its header (`-- @include stream_ids`)
-- gets it after its header (`engine::scripts::source`).

-- A stream id's two parts ("<ms>-<seq>") as numbers.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

-- Whether stream id a comes before stream id b.
local function id_less(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  return am < bm or (am == bm and as < bs)
end
