-- seed_dequeue.lua: the seed posts' dequeue (004, with its known flaws fixed: earliest due
-- first, and the move into the stream in the same script), for `delayq bench --scenario
-- seed` only.
--
-- KEYS[1]  the due ZSET; KEYS[2] the payload HASH; KEYS[3] the stream
-- ARGV[1]  now (unix ms, the Redis clock as the poller read it); ARGV[2] most ids per call
--
-- Returns the number of orders moved. Atomic so an order removed from the ZSET is always
-- in the stream (no loss between the two). The bench writes the arguments itself, so it
-- checks none. `ZRANGE ... BYSCORE LIMIT`: Redis >= 6.2.
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
if #ids == 0 then
  return 0
end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
for i, id in ipairs(ids) do
  if payloads[i] then
    redis.call('XADD', KEYS[3], '*', 'id', id, 'payload', payloads[i])
  end
end
return #ids
