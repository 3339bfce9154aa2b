-- quota_queue.lua: admit a queue into a namespace, up to its queue quota.
-- KEYS[1] queues  SET  queue names of the namespace
-- ARGV[1] queue name, ARGV[2] most queues (0 = no limit)
-- Returns: 1 when the queue is (now) a member, 0 when the quota refuses it.
-- O(1): SISMEMBER, SCARD, SADD. Atomic, so concurrent creations through
-- several replicas cannot overshoot the quota.
local k_queues, queue, most = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('SISMEMBER', k_queues, queue) == 1 then return 1 end
if most > 0 and redis.call('SCARD', k_queues) >= most then return 0 end
redis.call('SADD', k_queues, queue)
return 1
