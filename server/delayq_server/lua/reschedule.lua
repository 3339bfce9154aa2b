-- reschedule.lua: move a waiting (or, with force, leased) job to a new due time,
-- keeping its id, payload and attempts (issue 14).
-- KEYS[1] index ZSET (backlog bucket starts, includes/record.lua), KEYS[2] ready LIST, KEYS[3] leased ZSET, KEYS[4] stats HASH
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] unused (was the bucket width),
-- ARGV[4] job id, ARGV[5] delay ms (-1 when a due time is given), ARGV[6] due ms (-1),
-- ARGV[7] force '1' | '0', ARGV[8] shard channel (SPUBLISH)
-- Returns: {code, state before, new due ms, nonce of a lease taken back or ''}
--   code 0 done, -1 no such job, -3 leased (no force), -4 dead or completed,
--   -5 the new due time is at or past the job's expiry
-- A job taken back from a lease keeps its counted attempt (the delivery may have
-- run); the holder's Ack, Nack or ExtendLease answer STALE (fenced nonce).
local k_index, k_ready, k_leased, k_stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, id = ARGV[1], ARGV[4]
local delay, due_at, force, channel = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8]
-- @include record
local now = now_ms(ARGV[2])
local rec = load(prefix, id)
if not rec then return {-1, 0, 0, ''}, false end
local st = rec[R_STATE]
local due = due_at
if delay >= 0 then due = now + delay end
if due < now then due = now end
if st == S_DEAD or st == S_COMPLETED then return {-4, st, 0, ''}, false end
if st == S_LEASED and not force then return {-3, st, 0, ''}, false end
if rec[R_EXPIRE] > 0 and due >= rec[R_EXPIRE] then return {-5, st, 0, ''}, false end
local nonce = ''
if st == S_SCHEDULED then
  if backlog_remove(prefix, k_index, id, rec[R_DUE]) == 1 then
    redis.call('HINCRBY', k_stats, 'backlog', -1)
  else
    redis.call('LREM', k_ready, -1, id)  -- promoted without a record update
    st = S_READY
  end
elseif st == S_READY then
  redis.call('LREM', k_ready, -1, id)
else
  nonce = rec[R_TOKEN]
  redis.call('ZREM', k_leased, id)
end
rec[R_DUE] = due
rec[R_TOKEN] = ''
if due <= now then
  rec[R_STATE] = S_READY
  save(prefix, id, rec)
  local was_empty = redis.call('LLEN', k_ready) == 0
  redis.call('LPUSH', k_ready, id)
  if was_empty then redis.call('SPUBLISH', channel, prefix .. ' ready 1') end
else
  rec[R_STATE] = S_SCHEDULED
  local head_due = backlog_head(prefix, k_index)
  save(prefix, id, rec)
  backlog_add(prefix, k_index, id, due)
  redis.call('HINCRBY', k_stats, 'backlog', 1)
  if not head_due or due < head_due then
    redis.call('SPUBLISH', channel, prefix .. ' due ' .. string.format('%d', due))
  end
end
return {0, st, due, nonce}
