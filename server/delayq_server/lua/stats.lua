-- stats.lua: one shard's counts, read at one instant. Read-only.
-- KEYS[1] stats   HASH  counters ('backlog' is the scheduled count)
-- KEYS[2] ready   LIST  job ids due now
-- KEYS[3] leased  ZSET  job id -> lease deadline ms
-- KEYS[4] dead    ZSET  job id -> time of death ms
-- KEYS[5] done    ZSET  job id -> completion ms
-- KEYS[6] index   ZSET  backlog bucket start ms (includes/record.lua)
-- ARGV[1] prefix
-- Returns: {now ms, counters as a flat field/value list, ready, leased, dead, done,
--   due ms of the oldest ready job (-1: none), earliest due ms in the backlog (-1: none)}
-- One script, not a pipeline and follow-up reads: a job moves between the
-- backlog, the ready list and a lease between two reads, so a drain that waits
-- for "nothing scheduled, ready or leased" saw zero while a nacked job was
-- being promoted (docs/decisions.md, "Stats read at one instant").
-- Bounded: fixed reads (the oldest ready record, the backlog's head bucket).
local k_stats, k_ready, k_leased, k_dead, k_done, k_index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local prefix = ARGV[1]
-- @include record
local now = now_ms('')
local oldest_due = -1
local oldest = redis.call('LINDEX', k_ready, -1)
if oldest then
  local rec = load(prefix, oldest)
  if rec then oldest_due = rec[R_DUE] end
end
return {
  now,
  redis.call('HGETALL', k_stats),
  redis.call('LLEN', k_ready),
  redis.call('ZCARD', k_leased),
  redis.call('ZCARD', k_dead),
  redis.call('ZCARD', k_done),
  oldest_due,
  backlog_head(prefix, k_index) or -1,
}
