-- purge.lua: delete up to `limit` jobs of one state of a shard (issue 14).
-- KEYS[1] index ZSET (backlog bucket starts, includes/record.lua), KEYS[2] ready LIST, KEYS[3] leased ZSET, KEYS[4] dead ZSET,
-- KEYS[5] done ZSET, KEYS[6] exp ZSET, KEYS[7] stats HASH
-- ARGV[1] prefix, ARGV[2] state (1 scheduled .. 5 completed), ARGV[3] limit (<= 200),
-- ARGV[4] events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: {purged, jobs left in that state}
-- Bounded: at most `limit` ids and 64 buckets per call (~0.5 ms for 200 jobs:
-- one ZREM/RPOP, an HDEL per job and one ZREM over the batch); the caller loops.
-- Oldest first: the head of the backlog, the tail of the ready list, the
-- earliest lease deadline, the oldest death or completion. A purged lease is
-- gone: its holder's Ack answers UNKNOWN.
local k_index, k_ready, k_leased, k_dead, k_done, k_exp, k_stats =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local prefix, state, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- @include record
-- @include events
local ids = {}
if state == S_SCHEDULED then
  for _ = 1, 64 do
    if #ids >= limit then break end
    local head = redis.call('ZRANGE', k_index, 0, 0)
    if not head[1] then break end
    local bkey = bucket_key(prefix, head[1])
    local got = redis.call('ZRANGE', bkey, 0, limit - #ids - 1)
    if #got > 0 then
      redis.call('ZREM', bkey, unpack(got))
      for _, id in ipairs(got) do ids[#ids + 1] = id end
    end
    if redis.call('EXISTS', bkey) == 1 then break end
    redis.call('ZREM', k_index, head[1])
  end
  if #ids > 0 then redis.call('HINCRBY', k_stats, 'backlog', -#ids) end
elseif state == S_READY then
  ids = redis.call('RPOP', k_ready, limit) or {}
else
  local set = ({[S_LEASED] = k_leased, [S_DEAD] = k_dead, [S_COMPLETED] = k_done})[state]
  ids = redis.call('ZRANGE', set, 0, limit - 1)
  if #ids > 0 then redis.call('ZREM', set, unpack(ids)) end
end
if #ids > 0 then
  local now = 0
  if ev_maxlen > 0 then now = now_ms('') end
  for _, id in ipairs(ids) do
    if ev_maxlen > 0 then emit(prefix, 'deleted', id, now, load(prefix, id), 'purged') end
    drop(prefix, id)
  end
  redis.call('ZREM', k_exp, unpack(ids))
end
local left
if state == S_SCHEDULED then
  left = tonumber(redis.call('HGET', k_stats, 'backlog') or '0')
  if left < 0 then left = 0 end
elseif state == S_READY then
  left = redis.call('LLEN', k_ready)
elseif state == S_LEASED then
  left = redis.call('ZCARD', k_leased)
elseif state == S_DEAD then
  left = redis.call('ZCARD', k_dead)
else
  left = redis.call('ZCARD', k_done)
end
return {#ids, left}, #ids > 0
