-- expire.lua: drop jobs whose TTL ran out (any state but completed), counted.
-- KEYS[1] index  ZSET, KEYS[2] ready LIST, KEYS[3] leased ZSET, KEYS[4] dead ZSET,
-- KEYS[5] done ZSET, KEYS[6] exp ZSET, KEYS[7] stats HASH
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] unused (was the bucket width),
-- ARGV[4] limit (<= 500), ARGV[5] completed retention ms,
-- ARGV[6] events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: {expired, completed tombstones trimmed, next ms this needs running (-1: nothing pending),
-- now}; at most `limit` of each per call (next ms = now when more are pending)
-- Also trims completed jobs past the retention window, records and index
-- (grouped records have no TTL of their own). claim.lua checks TTL too, so the
-- expiry sweep only frees memory.
local k_done, k_exp, k_stats = KEYS[5], KEYS[6], KEYS[7]
local prefix, limit, retention = ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[5])
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local ids = redis.call('ZRANGE', k_exp, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local expired = 0
for _, id in ipairs(ids) do
  local st, _, rec = remove_job(prefix, KEYS[1], KEYS[2], KEYS[3], KEYS[4], k_done, k_exp, k_stats, id)
  if st > 0 then
    expired = expired + 1
    emit(prefix, 'expired', id, now, rec, 'ttl')
  end
  redis.call('ZREM', k_exp, id)
end
if expired > 0 then redis.call('HINCRBY', k_stats, 'expired', expired) end
-- Bounded like the expiry above: at most `limit` tombstones per call.
local old = redis.call('ZRANGE', k_done, '-inf', now - retention, 'BYSCORE', 'LIMIT', 0, limit)
local trimmed = #old
if trimmed > 0 then
  redis.call('ZREM', k_done, unpack(old))
  for _, id in ipairs(old) do
    local rec = load(prefix, id)
    if rec and rec[R_STATE] == S_COMPLETED then drop(prefix, id) end
  end
end
local next_ms = -1
local e = redis.call('ZRANGE', k_exp, 0, 0, 'WITHSCORES')
if e[2] then next_ms = tonumber(e[2]) end
local d = redis.call('ZRANGE', k_done, 0, 0, 'WITHSCORES')
if d[2] then
  local t = tonumber(d[2]) + retention
  if next_ms < 0 or t < next_ms then next_ms = t end
end
if #ids >= limit or trimmed >= limit then next_ms = now end
return {expired, trimmed, next_ms, now}
