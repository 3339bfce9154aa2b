-- quota_stream.lua: hold a slot for one Consume stream, up to the namespace's quota.
-- KEYS[1] streams  ZSET  stream id -> slot expiry ms (renewed while the stream is open)
-- ARGV[1] now ms ('' = Redis TIME), ARGV[2] stream id (server id / stream seq),
-- ARGV[3] most streams (> 0), ARGV[4] slot ttl ms
-- Returns: {1, count} when held, {0, count} when the quota refuses it.
-- Slots of crashed replicas are not renewed and drop out after the ttl, so
-- they cannot leak the quota. Expired slots removed per call are bounded by
-- the quota itself (no more than `most` slots are ever added).
local k_streams, member = KEYS[1], ARGV[2]
local most, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
-- @include clock
local now = now_ms(ARGV[1])
redis.call('ZREMRANGEBYSCORE', k_streams, '-inf', now)
local count = redis.call('ZCARD', k_streams)
if redis.call('ZSCORE', k_streams, member) == false and count >= most then
  return {0, count}
end
redis.call('ZADD', k_streams, now + ttl, member)
redis.call('PEXPIRE', k_streams, ttl)
return {1, count + 1}
