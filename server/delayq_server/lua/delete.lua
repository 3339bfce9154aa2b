-- delete.lua: remove one job in any state; it is never delivered afterwards.
-- KEYS[1] index  ZSET, KEYS[2] ready LIST, KEYS[3] leased ZSET, KEYS[4] dead ZSET,
-- KEYS[5] done ZSET, KEYS[6] exp ZSET, KEYS[7] stats HASH
-- ARGV[1] prefix, ARGV[2] unused (was the bucket width), ARGV[3] job id,
-- ARGV[4] events MAXLEN (0 = off; lua/includes/events.lua)
-- Returns: {state the job was in (1..5, 0 when there is no such job), lease nonce or ''}
-- A ready job costs an LREM (O(ready length)); deletes are rare next to deliveries.
-- @include record
-- @include events
local state, nonce, rec = remove_job(ARGV[1], KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  KEYS[7], ARGV[3])
if state > 0 then emit(ARGV[1], 'deleted', ARGV[3], now_ms(''), rec, '') end
return {state, nonce}, state ~= 0
