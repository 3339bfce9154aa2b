-- backlog.lua: count a shard's backlog by due time (next minute, hour, day). Read-only.
-- KEYS[1] index  ZSET  backlog bucket start ms -> the same (includes/record.lua)
-- KEYS[2] stats  HASH  counters ('backlog' is the scheduled count)
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME; later calls of one count pass
-- the first call's now so every call uses the same boundaries),
-- ARGV[3] unused (was the bucket width), ARGV[4] cursor: score of the last bucket already
-- counted ('' = from the start), ARGV[5] limit (buckets per call, <= 1000)
-- Returns: {now, backlog, due < now+1m, due in [now+1m, now+1h), due in
-- [now+1h, now+1d), cursor for the next call (-1: done)}
-- The index scores are bucket starts (layout v2), and buckets hold disjoint
-- due ranges (from their start to the next start), so index order is bucket
-- order and the starts before now+1d name every bucket with jobs due within a
-- day. A bucket whose first and last due times fall in one range counts by
-- ZCARD; only a bucket that straddles a boundary needs ZCOUNTs. Bounded: at most `limit` buckets per call; the
-- caller calls again with the cursor. Jobs due later are backlog minus the rest.
local k_index, k_stats = KEYS[1], KEYS[2]
local prefix, limit = ARGV[1], tonumber(ARGV[5])
-- @include clock
local now = now_ms(ARGV[2])
local bounds = {now + 60000, now + 3600000, now + 86400000}
local counts = {0, 0, 0}
local from = '-inf'
if ARGV[4] ~= '' then from = '(' .. ARGV[4] end
local entries = redis.call('ZRANGE', k_index, from, '(' .. bounds[3], 'BYSCORE', 'LIMIT', 0, limit,
  'WITHSCORES')
local cursor = -1
for i = 1, #entries, 2 do
  local bkey = prefix .. 'bt:' .. entries[i]
  local lo_due = redis.call('ZRANGE', bkey, 0, 0, 'WITHSCORES')
  local hi_due = redis.call('ZRANGE', bkey, -1, -1, 'WITHSCORES')
  local first, last = tonumber(lo_due[2] or entries[i + 1]), tonumber(hi_due[2] or entries[i + 1])
  local lo = '-inf'
  for r = 1, 3 do
    if last < bounds[r] and (r == 1 or first >= bounds[r - 1]) then
      counts[r] = counts[r] + redis.call('ZCARD', bkey)
      break
    end
    if first < bounds[r] then -- straddles: count the part below this boundary
      counts[r] = counts[r] + redis.call('ZCOUNT', bkey, lo, '(' .. bounds[r])
    end
    lo = bounds[r]
  end
  cursor = tonumber(entries[i + 1])
end
if #entries < 2 * limit then cursor = -1 end
local backlog = tonumber(redis.call('HGET', k_stats, 'backlog') or '0')
return {now, backlog, counts[1], counts[2], counts[3], cursor}
