-- extend.lua: push a lease deadline to now + extension, if the token is current.
-- KEYS[1] leased  ZSET  job id -> lease deadline ms
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] job id, ARGV[4] nonce,
-- ARGV[5] extension ms
-- Returns: {code, deadline ms}; code 1 ok, -1 unknown job, -2 stale token
local k_leased = KEYS[1]
local prefix, id, nonce, ext = ARGV[1], ARGV[3], ARGV[4], tonumber(ARGV[5])
-- @include record
local now = now_ms(ARGV[2])
local rec = load(prefix, id)
if not rec then return {-1, 0}, false end
if rec[R_STATE] ~= S_LEASED or rec[R_TOKEN] ~= nonce then return {-2, 0}, false end
redis.call('ZADD', k_leased, 'XX', now + ext, id)
return {1, now + ext}
