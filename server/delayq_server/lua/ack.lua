-- ack.lua: complete leased jobs whose token is current.
-- KEYS[1] leased  ZSET  job id -> lease deadline ms
-- KEYS[2] stats   HASH  counters
-- KEYS[3] exp     ZSET  job id -> expire ms
-- KEYS[4] done    ZSET  job id -> completion ms (only with retention)
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] retention ms (0 = delete now),
-- ARGV[4] n (<= 1000), then n pairs: job id, nonce, then events MAXLEN (0 = off;
-- lua/includes/events.lua)
-- Returns: one code per pair: 1 acked, 2 stale (token no longer current), 3 unknown job
-- A completed record keeps its last token, so a retried Ack (its reply was
-- lost) is answered "acked" again while the job is retained.
local k_leased, k_stats, k_exp, k_done = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, retention, n = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local out, acked = {}, 0
for i = 0, n - 1 do
  local id, nonce = ARGV[5 + i * 2], ARGV[6 + i * 2]
  local rec = load(prefix, id)
  if not rec then
    out[i + 1] = 3
  elseif rec[R_STATE] == S_COMPLETED and rec[R_TOKEN] == nonce then
    out[i + 1] = 1
  elseif rec[R_STATE] ~= S_LEASED or rec[R_TOKEN] ~= nonce then
    out[i + 1] = 2
  else
    redis.call('ZREM', k_leased, id)
    redis.call('ZREM', k_exp, id)
    if retention > 0 then
      rec[R_STATE] = S_COMPLETED
      rec[R_FINISH] = now
      save(prefix, id, rec)  -- trimmed by expire.lua after the retention
      redis.call('ZADD', k_done, now, id)
    else
      drop(prefix, id)
    end
    acked = acked + 1
    emit(prefix, 'acked', id, now, rec, '')
    out[i + 1] = 1
  end
end
if acked > 0 then redis.call('HINCRBY', k_stats, 'acked', acked) end
return out, acked > 0  -- nothing changed: nothing to replay (replay.lua)
