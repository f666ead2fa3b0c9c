-- trim.lua: trim a stream below what every consumer group still needs, atomically.
--
-- KEYS[1]  the shard's STREAM
--
-- The safe trim point is the minimum over all groups of (oldest pending id, last-delivered
-- id): every entry before it has been delivered to and acknowledged by every group. Entries
-- at or after it are kept (XTRIM MINID removes ids strictly below). A stream without groups
-- is not trimmed (a group created later reads from the start).
-- Returns: { removed, trim_point or false, length }: length is the stream's length after the
-- trim (1 or 0 when every group has read and acknowledged everything: the trim chore then
-- stops looking at the shard until something is dispatched into it again).
-- Cost: O(groups) (XINFO GROUPS, one summary XPENDING per group) plus the entries removed
-- (XTRIM frees whole stream nodes). Redis >= 6.2.
-- @include stream_ids, groups
local groups = groups_of(KEYS[1])
if #groups == 0 then return { 0, false, 0 } end
local min = nil
for _, g in ipairs(groups) do
  local name, last = g['name'], g['last-delivered-id']
  local cand = last
  local p = redis.call('XPENDING', KEYS[1], name)
  if p[1] > 0 and id_less(p[2], cand) then cand = p[2] end
  if not min or id_less(cand, min) then min = cand end
end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', min)
return { removed, min, redis.call('XLEN', KEYS[1]) }
