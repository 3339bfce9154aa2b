-- read.lua: one job's record and the shard node's clock, read together.
-- KEYS[1] records HASH  the job's record group (dq:{ns/queue/shard}:r:<2 chars>)
-- ARGV[1] job id
-- Returns: {record or false, now ms}
-- Read-only. A script rather than a GET+TIME pipeline because Redis Cluster
-- clients cannot pipeline keyless commands; the time is the same node's, so a
-- job's due time and "now" come from one clock (docs/design.md, promise 4).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('HGET', KEYS[1], ARGV[1]), now}
