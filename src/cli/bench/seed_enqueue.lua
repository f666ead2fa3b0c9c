-- seed_enqueue.lua: the seed posts' enqueue (004), for `delayq bench --scenario seed` only:
-- one order per call, its due time in a ZSET and its payload in a HASH.
--
-- KEYS[1]  the due ZSET     member = order id, score = due time (unix ms)
-- KEYS[2]  the payload HASH field = order id, value = payload JSON
-- ARGV[1]  the order id; ARGV[2] its due time (unix ms); ARGV[3] its payload
--
-- Returns 1. Atomic so an order is never due without its payload. The bench writes the
-- arguments itself (nothing from outside), so it checks none. Redis >= 6.2.
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
