-- release.lua: put leased jobs back to ready at once: a Consume stream closed
-- (its grace, if any, ran out) or a consumer gave deliveries back (Release).
-- KEYS[1] ready   LIST  job ids due now
-- KEYS[2] leased  ZSET  job id -> lease deadline ms
-- KEYS[3] dead    ZSET  job id -> time of death ms
-- KEYS[4] stats   HASH  counters
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] shard channel (SPUBLISH),
-- ARGV[4] n (<= 1000), then n triples: job id, nonce, counted (1 = the delivery may
-- have run: a closed stream's sent delivery; 0 = never started: claimed but never
-- sent, or given back with Release, so its attempt is not counted),
-- then events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: one code per triple: 1 released, 2 stale (token no longer current),
-- 3 unknown job, 4 dead-lettered (counted, on the final attempt)
-- Released jobs go to the consuming end of the list: they were due first.
-- A counted release keeps the attempt claim counted, so a job that crashes every
-- worker that takes it still reaches the dead set after max_attempts; an
-- uncounted one never dead-letters (its attempts drop back below max_attempts).
local k_ready, k_leased, k_dead, k_stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, channel, n = ARGV[1], ARGV[3], tonumber(ARGV[4])
-- @include record
-- @include events
local now = now_ms(ARGV[2])
local out, released, changed = {}, 0, false
local was_empty = redis.call('LLEN', k_ready) == 0
for i = 0, n - 1 do
  local id, nonce, counted = ARGV[5 + i * 3], ARGV[6 + i * 3], ARGV[7 + i * 3] == '1'
  local rec = load(prefix, id)
  if not rec then
    out[i + 1] = 3
  elseif rec[R_STATE] ~= S_LEASED or rec[R_TOKEN] ~= nonce then
    out[i + 1] = 2
  else
    redis.call('ZREM', k_leased, id)
    changed = true
    if not counted and rec[R_ATTEMPTS] > 0 then rec[R_ATTEMPTS] = rec[R_ATTEMPTS] - 1 end
    if counted and rec[R_ATTEMPTS] >= rec[R_MAX] then
      to_dead(prefix, k_dead, k_stats, id, rec, now, 'consumer went away on the final attempt')
      emit(prefix, 'dead', id, now, rec, 'consumer went away on the final attempt')
      out[i + 1] = 4
    else
      rec[R_STATE] = S_READY
      rec[R_TOKEN] = ''
      save(prefix, id, rec)
      redis.call('RPUSH', k_ready, id)
      released = released + 1
      emit(prefix, 'released', id, now, rec, counted and '' or 'unsent')
      out[i + 1] = 1
    end
  end
end
if released > 0 and was_empty then redis.call('SPUBLISH', channel, prefix .. ' ready ' .. released) end
return out, changed  -- no lease matched: nothing to replay (replay.lua)
