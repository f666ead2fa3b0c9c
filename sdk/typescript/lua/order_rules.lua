-- order_rules.lua: register in a queue's registry record the cancel-on-event rules its
-- orders declare for themselves (issue 43 item 4; src/engine/events.rs, "Order rules"), so
-- that an event computes its tokens for them.
--
-- KEYS[1]  the queue's registry record HASH ({ns}:queue:<q>)
-- ARGV[1]  the most order rules a queue keeps (src/engine/events.rs MAX_ORDER_RULES)
-- ARGV[2 ..]  the rules, each as its record field "order_rule:<rule JSON>"
--
-- Returns: the number of rules added (0: every one was known); -1: the queue is not
-- registered or is being deleted (nothing written: no record is made for it); -2: the
-- queue would keep more than ARGV[1] order rules (nothing written).
-- Why one script: the record's check, the count and the writes together, so no record is
-- written for a deleted queue and concurrent producers cannot pass the bound. Every
-- argument is checked before the first write.
-- Cost: O(F) in the record's fields (HKEYS; a few plus at most ARGV[1] rules) + one HSET.
-- Redis >= 6.2.
-- @include int

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

local max = int(ARGV[1])
if not max or max < 1 then
  return redis.error_reply('ERR delayq order_rules: the bound must be a positive integer')
end
for i = 2, #ARGV do
  if string.sub(ARGV[i], 1, 11) ~= 'order_rule:' or #ARGV[i] == 11 then
    return redis.error_reply('ERR delayq order_rules: a rule field must be order_rule:<rule JSON>')
  end
end
local state = redis.call('HMGET', KEYS[1], 'shards', 'deleting')
if not state[1] or state[2] then return -1 end
local known, count = {}, 0
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 11) == 'order_rule:' then known[f] = true; count = count + 1 end
end
local add = {}
for i = 2, #ARGV do
  if not known[ARGV[i]] then
    known[ARGV[i]] = true
    add[#add + 1] = ARGV[i]
    add[#add + 1] = '1'
  end
end
if #add == 0 then return 0 end
if count + #add / 2 > max then return -2 end
redis.call('HSET', KEYS[1], unpack(add))
return #add / 2
