-- replicas.lua: a replica's heartbeat; returns how many replicas are alive.
-- KEYS[1] replicas  ZSET  server id -> Redis-clock ms of its last heartbeat
-- ARGV[1] server id, ARGV[2] liveness window ms, ARGV[3] '1' when leaving (shutdown)
-- Returns: ids of the replicas that beat within the window (this one included unless leaving).
-- Bounded: the set holds one entry per live replica; dead ones are trimmed here.
local k_replicas = KEYS[1]
local me, window, leaving = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', k_replicas, '-inf', now - window)
if leaving then
  redis.call('ZREM', k_replicas, me)
else
  redis.call('ZADD', k_replicas, now, me)
end
return redis.call('ZRANGE', k_replicas, 0, -1)
