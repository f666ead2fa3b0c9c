-- replay.lua: redeliver dead letters to the group that failed them, and only to it.
--
-- KEYS[1]  the shard's dead-letter STREAM
-- KEYS[2]  the shard's STREAM
-- ARGV[1]  group filter: only dead letters of this group ("" = any group)
-- ARGV[2..] dead-letter entry ids
--
-- Each dead letter is appended to the stream as a new entry with its original fields plus
-- for_group = <its group> (every other group acknowledges it without running its handler),
-- then deleted from the dead-letter stream, in this one script: an interrupted replay loses
-- nothing. The new entry starts again at attempt 1.
-- Returns: the number of entries replayed (ids not found or of another group are skipped).
local n = 0
for i = 2, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if e[1] then
    local f = e[1][2]
    local group
    for j = 1, #f, 2 do if f[j] == 'group' then group = f[j + 1] end end
    if group and (ARGV[1] == '' or ARGV[1] == group) then
      local out = {}
      for j = 1, #f, 2 do
        local k = f[j]
        if k == 'id' or k == 'due_ms' or k == 'data' or k == 'flag' then
          out[#out + 1] = k
          out[#out + 1] = f[j + 1]
        end
      end
      out[#out + 1] = 'for_group'
      out[#out + 1] = group
      redis.call('XADD', KEYS[2], '*', unpack(out))
      redis.call('XDEL', KEYS[1], ARGV[i])
      n = n + 1
    end
  end
end
return n
