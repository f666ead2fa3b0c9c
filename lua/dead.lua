-- dead.lua: move a failed entry to the dead-letter stream and acknowledge it, atomically.
--
-- KEYS[1]  the shard's STREAM
-- KEYS[2]  the group's timers ZSET for this shard
-- KEYS[3]  the shard's dead-letter STREAM
-- ARGV[1]  group
-- ARGV[2]  consumer that failed it
-- ARGV[3]  entry id
-- ARGV[4]  attempts made (the delivery count)
-- ARGV[5]  last error
-- ARGV[6]  now, unix ms
--
-- Dead-letter entry fields: the original entry's fields (id, due_ms, data or flag) followed by
-- group, attempts, error, dead_ms, entry (the original stream entry id).
-- Returns: 1 = dead-lettered; 0 = the entry is no longer this consumer's (nothing changed).
-- A canonical decimal integer within +-2^53 (no spaces, exponents, hex, nan or inf), or nil.
local function int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^-?[0-9]+$') then return nil end
  return tonumber(s)
end
if not int(ARGV[4]) or not int(ARGV[6]) then
  return redis.error_reply('ERR delayq dead: attempts and now must be integers')
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return 0 end
local fields = {}
local e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if e[1] then
  for _, v in ipairs(e[1][2]) do fields[#fields + 1] = v end
else
  fields = { 'flag', 'entry_missing' }
end
local skip = { group = true, attempts = true, error = true, dead_ms = true, entry = true, for_group = true }
local out = {}
for i = 1, #fields, 2 do
  if not skip[fields[i]] then
    out[#out + 1] = fields[i]
    out[#out + 1] = fields[i + 1]
  end
end
out[#out + 1] = 'group';    out[#out + 1] = ARGV[1]
out[#out + 1] = 'attempts'; out[#out + 1] = ARGV[4]
out[#out + 1] = 'error';    out[#out + 1] = ARGV[5]
out[#out + 1] = 'dead_ms';  out[#out + 1] = ARGV[6]
out[#out + 1] = 'entry';    out[#out + 1] = ARGV[3]
redis.call('XADD', KEYS[3], '*', unpack(out))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
