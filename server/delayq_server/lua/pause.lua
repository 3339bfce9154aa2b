-- pause.lua: pause or resume deliveries of one shard (issue 14).
-- KEYS[1] paused  STRING  present while the shard is paused (claim.lua checks it)
-- KEYS[2] ready   LIST    job ids due now
-- ARGV[1] prefix, ARGV[2] '1' pause | '0' resume, ARGV[3] shard channel (SPUBLISH)
-- Returns: 1 when the flag changed, 0 when it already was so.
-- Resuming publishes "<prefix> ready <n>" when jobs wait, so idle Consume
-- streams on every replica claim at once instead of at their idle fallback.
local k_paused, k_ready = KEYS[1], KEYS[2]
local prefix, pause, channel = ARGV[1], ARGV[2] == '1', ARGV[3]
if pause then
  if redis.call('EXISTS', k_paused) == 1 then return 0, false end
  redis.call('SET', k_paused, '1')
  return 1
end
if redis.call('DEL', k_paused) == 0 then return 0, false end
local n = redis.call('LLEN', k_ready)
if n > 0 then redis.call('SPUBLISH', channel, prefix .. ' ready ' .. n) end
return 1
