-- reap.lua: return jobs whose lease ran out to the backlog (with backoff) or
-- to the dead set when their attempts are exhausted.
-- KEYS[1] index   ZSET  backlog bucket start ms -> the same (includes/record.lua)
-- KEYS[2] ready   LIST  job ids due now
-- KEYS[3] leased  ZSET  job id -> lease deadline ms
-- KEYS[4] dead    ZSET  job id -> time of death ms
-- KEYS[5] stats   HASH  counters
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] limit (<= 500),
-- ARGV[4] unused (was the bucket width), ARGV[5] shard channel (SPUBLISH),
-- ARGV[6] events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: {reaped, next lease deadline ms (-1 none), now, then per reaped job: id, old nonce,
-- 1 when it was dead-lettered (its final attempt) else 0}
-- Conditional on the deadline, so any number of replicas may run it.
local k_index, k_ready, k_leased, k_dead, k_stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, limit, channel = ARGV[1], tonumber(ARGV[3]), ARGV[5]
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local ids = redis.call('ZRANGE', k_leased, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local out = {0, -1, now}
local was_empty = redis.call('LLEN', k_ready) == 0
local pushed = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', k_leased, id)
  local rec = load(prefix, id)
  if rec then
    table.insert(out, id)
    table.insert(out, rec[R_TOKEN])
    table.insert(out, rec[R_ATTEMPTS] >= rec[R_MAX] and 1 or 0)
    if rec[R_ATTEMPTS] >= rec[R_MAX] then
      to_dead(prefix, k_dead, k_stats, id, rec, now, 'lease expired on the final attempt')
      emit(prefix, 'dead', id, now, rec, 'lease expired on the final attempt')
    else
      pushed = pushed + to_retry(prefix, k_index, k_ready, k_stats, id, rec, now,
        backoff_ms(rec, id), 'lease expired')
      emit(prefix, 'nacked', id, now, rec, 'lease expired')
    end
  end
end
out[1] = #ids
local head = redis.call('ZRANGE', k_leased, 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
if pushed > 0 and was_empty then redis.call('SPUBLISH', channel, prefix .. ' ready ' .. pushed) end
if #ids > 0 then redis.call('SPUBLISH', channel, prefix .. ' due 0') end
return out, #ids > 0
