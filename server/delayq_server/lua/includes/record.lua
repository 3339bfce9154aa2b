-- record.lua: the packed job record and shared helpers.
-- A job record is one Redis STRING holding a msgpack array (see
-- delayq_server/store/records.py, which must agree on these indices).
-- One string per job costs ~40% of a hash per job (docs/design.md, "Redis layout").
local R_STATE, R_ATTEMPTS, R_MAX, R_DUE, R_CREATED, R_EXPIRE = 1, 2, 3, 4, 5, 6
local R_LASTDEL, R_FINISH, R_TOKEN, R_ERR = 7, 8, 9, 10
local R_B_INIT, R_B_MAX, R_B_MULT, R_B_JIT, R_HEADERS, R_PAYLOAD = 11, 12, 13, 14, 15, 16
local S_SCHEDULED, S_READY, S_LEASED, S_DEAD, S_COMPLETED = 1, 2, 3, 4, 5

-- @include clock

local function load(prefix, id)
  local raw = redis.call('GET', prefix .. 'j:' .. id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save(prefix, id, rec)
  redis.call('SET', prefix .. 'j:' .. id, cmsgpack.pack(rec))
end

-- Puts an id in the time-bucket backlog; the index keeps each bucket's earliest due.
local function backlog_add(prefix, index, width, id, due)
  local b = math.floor(due / width)
  redis.call('ZADD', prefix .. 'b:' .. b, due, id)
  redis.call('ZADD', index, 'LT', due, b)
end

-- Removes an id from its bucket; fixes the index entry. Returns 1 when removed.
local function backlog_remove(prefix, index, width, id, due)
  local b = math.floor(due / width)
  local bkey = prefix .. 'b:' .. b
  local n = redis.call('ZREM', bkey, id)
  if n == 1 then
    local first = redis.call('ZRANGE', bkey, 0, 0, 'WITHSCORES')
    if first[1] then
      redis.call('ZADD', index, 'XX', first[2], b)
    else
      redis.call('ZREM', index, b)
    end
  end
  return n
end

-- Backoff for the attempt just failed: min(max, init * mult^(attempt-1)),
-- shortened by up to `jitter` of itself. The random fraction comes from the
-- job id and attempt, so it differs per job yet replays identically.
local function backoff_ms(rec, id)
  local attempt = rec[R_ATTEMPTS]
  if attempt < 1 then attempt = 1 end
  local d = rec[R_B_INIT] * (rec[R_B_MULT] ^ (attempt - 1))
  if d > rec[R_B_MAX] then d = rec[R_B_MAX] end
  local jit = rec[R_B_JIT]
  if jit > 0 then
    local r = tonumber(string.sub(redis.sha1hex(id .. ':' .. attempt), 1, 8), 16) / 4294967295
    d = d * (1 - jit * r)
  end
  return math.floor(d)
end

-- Moves a leased job to the dead set.
local function to_dead(prefix, dead, stats, id, rec, now, reason)
  rec[R_STATE] = S_DEAD
  rec[R_FINISH] = now
  rec[R_TOKEN] = ''
  rec[R_ERR] = reason
  save(prefix, id, rec)
  redis.call('ZADD', dead, now, id)
  redis.call('HINCRBY', stats, 'dead_lettered', 1)
end

-- Schedules a retry `delay` ms from now (ready at once when 0). Returns 1 when
-- the job went straight to the ready list.
local function to_retry(prefix, index, ready, stats, width, id, rec, now, delay, reason)
  local due = now + delay
  rec[R_DUE] = due
  rec[R_TOKEN] = ''
  rec[R_ERR] = reason
  redis.call('HINCRBY', stats, 'retried', 1)
  if delay <= 0 then
    rec[R_STATE] = S_READY
    save(prefix, id, rec)
    redis.call('LPUSH', ready, id)
    return 1
  end
  rec[R_STATE] = S_SCHEDULED
  save(prefix, id, rec)
  backlog_add(prefix, index, width, id, due)
  redis.call('HINCRBY', stats, 'backlog', 1)
  return 0
end

-- Removes a job from whichever structure holds it, then its record.
-- A ready id is searched from the tail (LREM -1): ids enter at the head
-- (LPUSH) and leave from the tail (RPOP; released ones are RPUSHed back there),
-- so the jobs that expire or are deleted while ready, the ones waiting
-- longest, sit near the tail. LREM 1 would walk the whole list past every
-- newer job first.
-- Returns the state it was in (0 when unknown), its lease nonce, so the
-- stream that held a deleted lease can get its credit back, and the record.
local function remove_job(prefix, k_index, k_ready, k_leased, k_dead, k_done, k_exp, k_stats, width, id)
  local rec = load(prefix, id)
  if not rec then return 0, '' end
  local st = rec[R_STATE]
  if st == S_SCHEDULED then
    if backlog_remove(prefix, k_index, width, id, rec[R_DUE]) == 1 then
      redis.call('HINCRBY', k_stats, 'backlog', -1)
    else
      -- Promoted to the ready list without a record update (promote.lua).
      redis.call('LREM', k_ready, -1, id)
      st = S_READY
    end
  elseif st == S_READY then
    redis.call('LREM', k_ready, -1, id)
  elseif st == S_LEASED then
    redis.call('ZREM', k_leased, id)
  elseif st == S_DEAD then
    redis.call('ZREM', k_dead, id)
  elseif st == S_COMPLETED then
    redis.call('ZREM', k_done, id)
  end
  redis.call('ZREM', k_exp, id)
  redis.call('DEL', prefix .. 'j:' .. id)
  if st == S_LEASED then return st, rec[R_TOKEN], rec end
  return st, '', rec
end
