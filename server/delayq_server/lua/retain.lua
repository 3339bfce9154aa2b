-- retain.lua: enforce a queue's dead-letter retention on one shard (issue 14).
-- KEYS[1] dead ZSET (job id -> time of death ms), KEYS[2] exp ZSET
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] max age ms (0 = none),
-- ARGV[4] most dead jobs kept by this shard (0 = none), ARGV[5] limit (<= 200)
-- Returns: {deleted, more 1 | 0, ms until the oldest dead job ages out (-1: none, or no age bound)}
-- Oldest deaths go first, at most `limit` per call; the janitor calls again
-- while `more` is set. Not replayed: a re-run deletes only what is still over.
local k_dead, k_exp = KEYS[1], KEYS[2]
local prefix, max_age, max_count, limit = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- @include record
local now = now_ms(ARGV[2])
local ids = {}
if max_count > 0 then
  local over = redis.call('ZCARD', k_dead) - max_count
  if over > 0 then ids = redis.call('ZRANGE', k_dead, 0, math.min(over, limit) - 1) end
end
if max_age > 0 and #ids < limit then
  local old = redis.call('ZRANGE', k_dead, '-inf', '(' .. string.format('%d', now - max_age),
    'BYSCORE', 'LIMIT', #ids, limit - #ids)
  for _, id in ipairs(old) do ids[#ids + 1] = id end
end
local function next_in()
  if max_age <= 0 then return -1 end
  local head = redis.call('ZRANGE', k_dead, 0, 0, 'WITHSCORES')
  if not head[2] then return -1 end
  return math.max(0, tonumber(head[2]) + max_age - now)
end
if #ids == 0 then return {0, 0, next_in()} end
redis.call('ZREM', k_dead, unpack(ids))
for _, id in ipairs(ids) do drop(prefix, id) end
redis.call('ZREM', k_exp, unpack(ids))
local more = 0
if #ids >= limit then more = 1 end
return {#ids, more, next_in()}
