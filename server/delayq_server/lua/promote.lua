-- promote.lua: move due ids from the backlog to the ready list, oldest first.
-- KEYS[1] index   ZSET  backlog bucket start ms -> the same (includes/record.lua)
-- KEYS[2] ready   LIST  job ids due now
-- KEYS[3] stats   HASH  counters ('backlog' is decremented)
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] limit (ids per call),
-- ARGV[4] unused (was the bucket width), ARGV[5] shard channel (SPUBLISH)
-- Returns: {moved, next due ms (-1 when the backlog is empty), now}
-- Bounded: at most `limit` ids and 64 buckets per call, so a million jobs due
-- at once never blocks Redis; the caller calls again while moved == limit.
-- Publishes "<prefix> ready" when the ready list was empty: whichever replica
-- promotes, idle streams on every replica wake.
-- Records are not rewritten here (a due SCHEDULED record reads as READY):
-- that keeps promotion O(ids) with no msgpack work.
local k_index, k_ready, k_stats = KEYS[1], KEYS[2], KEYS[3]
local prefix, limit = ARGV[1], tonumber(ARGV[3])
-- @include record
local now = now_ms(ARGV[2])
local was_empty = redis.call('LLEN', k_ready) == 0
local moved = promote_due(prefix, k_index, k_ready, now, limit)
if moved > 0 then
  redis.call('HINCRBY', k_stats, 'backlog', -moved)
  if was_empty then redis.call('SPUBLISH', ARGV[5], prefix .. ' ready ' .. moved) end
end
local next_due = backlog_head(prefix, k_index) or -1
return {moved, next_due, now}
