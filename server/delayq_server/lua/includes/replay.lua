-- replay.lua: makes a state-changing script safe to re-send after a lost reply.
-- The caller (Store._run) appends one key after the script's own KEYS:
-- <shard prefix>rq:<request id>, unique per call and in the shard's hash tag.
-- redis-py re-sends a command on a fresh connection when the old one drops; a
-- re-sent call finds the reply stored by the first run and returns it instead
-- of running the body twice (docs/decisions.md, "Lost replies").
-- The entry lives REPLAY_TTL_MS, longer than the client's whole retry schedule.
-- (promote and expire are not replayed: see store/scripts.py.)
local function replay_get()
  local raw = redis.call('GET', KEYS[#KEYS])
  if raw then return cmsgpack.unpack(raw) end
  return nil
end

local function replay_put(reply)
  redis.call('SET', KEYS[#KEYS], cmsgpack.pack(reply), 'PX', @REPLAY_TTL_MS@)
end

-- Enqueue cuts a batch into bounded calls (store/chunks.py); its calls share one
-- request key, a HASH with one field per call, so a 1,000-job batch of 40 calls
-- leaves one entry, not 40 (a key costs Redis ~150-300 B for those 30 s, which
-- `make bench`'s bytes per job counts).
local function replay_hget(field)
  local raw = redis.call('HGET', KEYS[#KEYS], field)
  if raw then return cmsgpack.unpack(raw) end
  return nil
end

local function replay_hput(field, reply)
  redis.call('HSET', KEYS[#KEYS], field, cmsgpack.pack(reply))
  redis.call('PEXPIRE', KEYS[#KEYS], @REPLAY_TTL_MS@)
end
