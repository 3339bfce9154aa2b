-- nack.lua: give a leased job back: retry after a delay, or dead-letter it.
-- KEYS[1] index   ZSET  backlog bucket start ms -> the same (includes/record.lua)
-- KEYS[2] ready   LIST  job ids due now
-- KEYS[3] leased  ZSET  job id -> lease deadline ms
-- KEYS[4] dead    ZSET  job id -> time of death ms
-- KEYS[5] stats   HASH  counters
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] unused (was the bucket width),
-- ARGV[4] job id, ARGV[5] nonce, ARGV[6] delay ms (-1 = the job's retry policy),
-- ARGV[7] dead letter now (0/1), ARGV[8] reason, ARGV[9] shard channel (SPUBLISH),
-- ARGV[10] events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: {code, state, due ms}; code 1 ok, -1 unknown job, -2 stale token
local k_index, k_ready, k_leased, k_dead, k_stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, id, nonce = ARGV[1], ARGV[4], ARGV[5]
local delay, force_dead, reason, channel = tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8], ARGV[9]
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local rec = load(prefix, id)
if not rec then return {-1, 0, 0}, false end
if rec[R_STATE] ~= S_LEASED or rec[R_TOKEN] ~= nonce then return {-2, rec[R_STATE], 0}, false end
redis.call('ZREM', k_leased, id)
if force_dead or rec[R_ATTEMPTS] >= rec[R_MAX] then
  if reason == '' then reason = 'attempts exhausted' end
  to_dead(prefix, k_dead, k_stats, id, rec, now, reason)
  emit(prefix, 'dead', id, now, rec, reason)
  return {1, S_DEAD, 0}
end
if delay < 0 then delay = backoff_ms(rec, id) end
local head_due = backlog_head(prefix, k_index)
local was_empty = redis.call('LLEN', k_ready) == 0
local to_ready = to_retry(prefix, k_index, k_ready, k_stats, id, rec, now, delay, reason)
emit(prefix, 'nacked', id, now, rec, reason)
if to_ready == 1 then
  if was_empty then redis.call('SPUBLISH', channel, prefix .. ' ready 1') end
  -- The contract answers SCHEDULED (retry at due time) or DEAD; a retry due
  -- now is a schedule whose due time is now, even though it waits in ready.
  return {1, S_SCHEDULED, now}
end
if not head_due or now + delay < head_due then
  redis.call('SPUBLISH', channel, prefix .. ' due ' .. string.format('%d', now + delay))
end
return {1, S_SCHEDULED, now + delay}
