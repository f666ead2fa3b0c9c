-- int.lua: `int(s)`, the one check of an integer argument.
-- An include, not a script: a script that names it in its header (`-- @include int`)
-- gets it after its header (`engine::scripts::source`).

-- A canonical decimal integer within +-(2^53 - 1) (no spaces, exponents, hex, nan or inf,
-- nothing a double cannot hold exactly), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^-?[0-9]+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 or n < -9007199254740991 then return nil end
  return n
end
