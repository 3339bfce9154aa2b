-- dead.lua: redrive (back to ready, attempts reset) or purge dead jobs.
-- KEYS[1] dead ZSET, KEYS[2] ready LIST, KEYS[3] stats HASH
-- ARGV[1] prefix, ARGV[2] action ('redrive' | 'purge'), ARGV[3] shard channel (SPUBLISH),
-- ARGV[4] limit (<= 1000, used when no ids are given), then job ids (may be none),
-- then events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: number of jobs moved or deleted.
local k_dead, k_ready, k_stats = KEYS[1], KEYS[2], KEYS[3]
local prefix, action, channel, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
-- @include record
-- @include events
local ids = {}
if #ARGV > 5 then
  for i = 5, #ARGV - 1 do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', k_dead, 0, limit - 1)
end
-- One clock read per call, and only when events are recorded (a TIME per
-- job was a third of a redrive's cost).
local now = 0
if ev_maxlen > 0 then now = now_ms('') end
local done = 0
local was_empty = redis.call('LLEN', k_ready) == 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', k_dead, id) == 1 then
    if action == 'purge' then
      if ev_maxlen > 0 then emit(prefix, 'deleted', id, now, load(prefix, id), 'purged') end
      drop(prefix, id)
    else
      local rec = load(prefix, id)
      if rec then
        rec[R_STATE] = S_READY
        rec[R_ATTEMPTS] = 0
        rec[R_FINISH] = 0
        save(prefix, id, rec)
        redis.call('LPUSH', k_ready, id)
        emit(prefix, 'redriven', id, now, rec, '')
      end
    end
    done = done + 1
  end
end
if action == 'redrive' and done > 0 and was_empty then
  redis.call('SPUBLISH', channel, prefix .. ' ready ' .. done)
end
return done, done > 0
