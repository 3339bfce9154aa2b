-- drop_shard.lua: delete the keys of an empty shard (DeleteQueue, issue 14).
-- KEYS[1] index ZSET, KEYS[2] ready LIST, KEYS[3] leased ZSET, KEYS[4] dead ZSET,
-- KEYS[5] done ZSET, KEYS[6] exp ZSET, KEYS[7] stats HASH, KEYS[8] paused STRING,
-- KEYS[9] events STREAM
-- ARGV[1] prefix
-- Returns: {dropped 1 | 0, scheduled, ready, leased, dead, completed}
-- Refuses (changes nothing) while any job is left: a queue is deleted only
-- after it was drained or purged. O(1): counts and a handful of DELs.
local counts = {
  redis.call('ZCARD', KEYS[1]), redis.call('LLEN', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('ZCARD', KEYS[4]), redis.call('ZCARD', KEYS[5])}
for _, c in ipairs(counts) do
  if c > 0 then return {0, counts[1], counts[2], counts[3], counts[4], counts[5]}, false end
end
redis.call('DEL', KEYS[1], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
return {1, 0, 0, 0, 0, 0}
