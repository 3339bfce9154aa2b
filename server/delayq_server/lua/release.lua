-- release.lua: a Consume stream closed; put its leased jobs back to ready at once.
-- KEYS[1] ready   LIST  job ids due now
-- KEYS[2] leased  ZSET  job id -> lease deadline ms
-- KEYS[3] dead    ZSET  job id -> time of death ms
-- KEYS[4] stats   HASH  counters
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] events channel,
-- ARGV[4] n (<= 1000), then n triples: job id, nonce, sent (1 = the delivery reached
-- the stream; 0 = claimed but never sent, so its attempt is not counted),
-- then events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: number of jobs released (tokens no longer current are skipped).
-- Released jobs go to the consuming end of the list: they were due first.
-- The attempt was counted at claim, so a job that crashes every worker that
-- takes it still reaches the dead set after max_attempts.
local k_ready, k_leased, k_dead, k_stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, channel, n = ARGV[1], ARGV[3], tonumber(ARGV[4])
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local released = 0
local was_empty = redis.call('LLEN', k_ready) == 0
for i = 0, n - 1 do
  local id, nonce, sent = ARGV[5 + i * 3], ARGV[6 + i * 3], ARGV[7 + i * 3]
  local rec = load(prefix, id)
  if rec and rec[R_STATE] == S_LEASED and rec[R_TOKEN] == nonce then
    redis.call('ZREM', k_leased, id)
    if sent == '0' then rec[R_ATTEMPTS] = rec[R_ATTEMPTS] - 1 end
    if rec[R_ATTEMPTS] >= rec[R_MAX] then
      to_dead(prefix, k_dead, k_stats, id, rec, now, 'consumer went away on the final attempt')
      emit(prefix, 'dead', id, now, rec, 'consumer went away on the final attempt')
    else
      rec[R_STATE] = S_READY
      rec[R_TOKEN] = ''
      save(prefix, id, rec)
      redis.call('RPUSH', k_ready, id)
      released = released + 1
      emit(prefix, 'released', id, now, rec, sent == '0' and 'unsent' or '')
    end
  end
end
if released > 0 and was_empty then redis.call('PUBLISH', channel, prefix .. ' ready') end
return released
