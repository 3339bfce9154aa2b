-- own.lua: take, keep or give up the timer ownership lease of one shard.
-- KEYS[1] owner  STRING  server id of the replica running the shard's timers (PX lease)
-- ARGV[1] server id, ARGV[2] lease ms, ARGV[3] '1' to give the lease up (shutdown)
-- Returns: 1 when this server holds the lease after the call, else 0.
-- Ownership only saves work: every timer script is conditional and idempotent,
-- so two replicas that both believe they own a shard (a paused owner waking up)
-- do the same work twice, never wrong work (docs/decisions.md, timer ownership).
local k_owner = KEYS[1]
local me, lease, give_up = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local holder = redis.call('GET', k_owner)
if give_up then
  if holder == me then redis.call('DEL', k_owner) end
  return 0
end
if holder == me then
  redis.call('PEXPIRE', k_owner, lease)
  return 1
end
if not holder then
  redis.call('SET', k_owner, me, 'PX', lease)
  return 1
end
return 0
