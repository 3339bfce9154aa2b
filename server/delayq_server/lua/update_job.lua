-- update_job.lua: replace the payload and/or headers of a waiting job (issue 14).
-- KEYS[1] the job's record group HASH (includes/record.lua)
-- ARGV[1] prefix, ARGV[2] set payload '1' | '0', ARGV[3] payload,
-- ARGV[4] set headers '1' | '0', ARGV[5] headers (msgpack map bytes), ARGV[6] job id
-- Returns: {code, state}: 0 done, -1 no such job, -4 not scheduled or ready
-- The record keeps its place in the backlog or ready list; only its bytes change.
local k_rec, id = KEYS[1], ARGV[6]
local raw = redis.call('HGET', k_rec, id)
if not raw then return {-1, 0}, false end
-- @include record
local rec = cmsgpack.unpack(raw)
local st = rec[R_STATE]
if st ~= S_SCHEDULED and st ~= S_READY then return {-4, st}, false end
if ARGV[2] == '1' then rec[R_PAYLOAD] = ARGV[3] end
if ARGV[4] == '1' then rec[R_HEADERS] = ARGV[5] end
redis.call('HSET', k_rec, id, cmsgpack.pack(rec))
return {0, st}
