-- quota_rate.lua: take n tokens from a namespace's enqueue token bucket.
-- KEYS[1] bucket  HASH  tokens (float), ts (ms of the last refill)
-- ARGV[1] now ms ('' = Redis TIME), ARGV[2] rate (tokens per second, > 0),
-- ARGV[3] burst (bucket size, >= 1), ARGV[4] n (tokens needed, >= 1),
-- ARGV[5] up to (optional, >= n): take as many as are there up to this, at least n
--   (a replica's local allowance, server quotas.py)
-- Returns: {1, 0, taken} when taken; {0, retry_after_ms, 0} when not (nothing taken);
-- {0, -1, 0} when n exceeds the burst and can never be taken at once.
-- O(1). The key expires once the bucket would be full again, so idle
-- namespaces leave nothing behind.
local k_bucket = KEYS[1]
local rate, burst, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local up_to = math.max(n, tonumber(ARGV[5] or n))
-- @include clock
local now = now_ms(ARGV[1])
if n > burst then return {0, -1, 0} end
local state = redis.call('HMGET', k_bucket, 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then tokens, ts = burst, now end
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate / 1000) end
local ok, retry, taken = 0, 0, 0
if tokens >= n then
  taken = math.max(n, math.min(up_to, math.floor(tokens)))
  tokens = tokens - taken
  ok = 1
else
  retry = math.ceil((n - tokens) * 1000 / rate)
end
redis.call('HSET', k_bucket, 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', k_bucket, math.ceil(burst * 1000 / rate) + 1000)
return {ok, retry, taken}
