-- record.lua: the packed job record, the backlog, and shared helpers.
-- A job record is a msgpack array (see delayq_server/store/records.py, which
-- must agree on these indices), kept as one field of a record group: a HASH
-- <prefix>r:<2 chars of the id's random part>, so 1,024 groups per shard and
-- routing by id alone (new ids set the first of the two chars from their
-- creation time, ids.py, so jobs enqueued together share a few warm groups).
-- Grouped records cost no key, object and dict entry
-- each; small groups stay listpack-encoded when the server's
-- hash-max-listpack-value admits a record (docs/decisions.md, "Memory layout v2").
local R_STATE, R_ATTEMPTS, R_MAX, R_DUE, R_CREATED, R_EXPIRE = 1, 2, 3, 4, 5, 6
local R_LASTDEL, R_FINISH, R_TOKEN, R_ERR = 7, 8, 9, 10
local R_B_INIT, R_B_MAX, R_B_MULT, R_B_JIT, R_HEADERS, R_PAYLOAD = 11, 12, 13, 14, 15, 16
local S_SCHEDULED, S_READY, S_LEASED, S_DEAD, S_COMPLETED = 1, 2, 3, 4, 5
-- Jobs per backlog bucket before it splits: below zset-max-listpack-entries
-- (128 by default), so every bucket stays listpack-encoded.
local BUCKET_CAP = 100

-- @include clock

local function group_key(prefix, id)
  return prefix .. 'r:' .. string.sub(id, 11, 12)
end

local function load_raw(prefix, id)
  return redis.call('HGET', group_key(prefix, id), id)
end

local function load(prefix, id)
  local raw = load_raw(prefix, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save_raw(prefix, id, packed)
  redis.call('HSET', group_key(prefix, id), id, packed)
end

local function save(prefix, id, rec)
  save_raw(prefix, id, cmsgpack.pack(rec))
end

local function drop(prefix, id)
  redis.call('HDEL', group_key(prefix, id), id)
end

-- The backlog: sorted sets of at most about BUCKET_CAP ids, each covering the
-- due times from its start up to the next bucket's start; the index (KEYS'
-- index, ZSET) holds each bucket's start as member and score. Buckets split
-- when they pass BUCKET_CAP, so dense and sparse due times alike fill them
-- (tens to a hundred jobs each) and every bucket stays listpack-encoded. A
-- bucket in the index is never empty.
local function bucket_key(prefix, start)
  return prefix .. 'bt:' .. start
end

-- Start of the bucket that holds due time `due` (the greatest start <= due), or nil.
local function bucket_of(index, due)
  local r = redis.call('ZRANGE', index, due, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
  return r[1]
end

-- Earliest due time in the backlog, or nil (the head bucket's first score).
local function backlog_head(prefix, index)
  local h = redis.call('ZRANGE', index, 0, 0)
  if not h[1] then return nil end
  local first = redis.call('ZRANGE', bucket_key(prefix, h[1]), 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

-- Moves due ids from the backlog to the ready list, oldest first: at most
-- `limit` ids and 64 buckets. Returns how many moved; the caller counts them
-- off the 'backlog' counter and announces them.
local function promote_due(prefix, index, ready, now, limit)
  local moved = 0
  for _ = 1, 64 do
    if moved >= limit then break end
    local head = redis.call('ZRANGE', index, 0, 0)
    -- A bucket's start is at most its earliest due time.
    if not head[1] or tonumber(head[1]) > now then break end
    local bkey = bucket_key(prefix, head[1])
    local ids = redis.call('ZRANGE', bkey, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit - moved)
    if #ids > 0 then
      redis.call('LPUSH', ready, unpack(ids))
      redis.call('ZREM', bkey, unpack(ids))
      moved = moved + #ids
    end
    if redis.call('EXISTS', bkey) == 1 then break end
    -- Emptied: later buckets may hold due jobs too.
    redis.call('ZREM', index, head[1])
  end
  return moved
end

-- Splits an overfull bucket at a due time inside it; jobs due from there on
-- move to a new bucket starting at it. Ids appended past the end split off
-- alone, so buckets filled in due order end up full, not half full. A bucket
-- whose jobs all share one due time cannot split (it only grows in a burst).
-- Returns true when it split.
local function bucket_split(prefix, index, start, bkey, n, due)
  local last = redis.call('ZRANGE', bkey, -2, -1, 'WITHSCORES')
  local at
  if tonumber(last[4]) == due and tonumber(last[2]) < due then
    at = due
  else
    local mid = redis.call('ZRANGE', bkey, math.floor(n / 2), math.floor(n / 2), 'WITHSCORES')
    at = tonumber(mid[2])
    if at <= tonumber(start) then
      local above = redis.call('ZRANGE', bkey, '(' .. at, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
      if not above[1] then return end
      at = tonumber(above[2])
    end
  end
  local moving = redis.call('ZRANGE', bkey, at, '+inf', 'BYSCORE', 'WITHSCORES')
  local args = {}
  for i = 1, #moving, 2 do
    args[#args + 1] = moving[i + 1]
    args[#args + 1] = moving[i]
  end
  local s = string.format('%d', at)
  redis.call('ZADD', bucket_key(prefix, s), unpack(args))
  redis.call('ZREMRANGEBYSCORE', bkey, at, '+inf')
  redis.call('ZADD', index, at, s)
  return true
end

-- Puts an id in the backlog. `memo` ({pend = {}}, one per script call, optional)
-- remembers the bucket the last due time went to and its size: jobs enqueued
-- with one delay in one call share their due ms, and each then costs no bucket
-- lookup, no ZCARD and, once the bucket is full of that one due time and cannot
-- split, no split probes (issue 12: Redis time per job). Their ids wait in
-- memo.pend and go into the bucket in one ZADD (backlog_flush): a ZADD per id
-- was ~1.3 µs of an enqueued job's ~10 (docs/decisions.md, 2026-11-26). The
-- caller flushes before it returns; backlog_add flushes before anything that
-- reads a bucket (a lookup, a split).
-- Scores go as integer strings: Redis formats a Lua number with "%.17g".
local function backlog_flush(memo)
  if memo and #memo.pend > 0 then
    -- At most 2 x 1,000 arguments (a call's jobs): within unpack's stack limit.
    redis.call('ZADD', memo.bkey, unpack(memo.pend))
    memo.pend = {}
  end
end

local function backlog_add(prefix, index, id, due, memo)
  local start, bkey, n, uniform
  if memo and memo.due == due then
    start, bkey, uniform = memo.start, memo.bkey, memo.uniform
    local pend = memo.pend
    pend[#pend + 1] = memo.due_s
    pend[#pend + 1] = id
    -- Ids are new, so each adds one (a re-used id only splits a bucket early).
    n = memo.n + 1
    if n > BUCKET_CAP and not uniform then backlog_flush(memo) end
  else
    backlog_flush(memo)
    local due_s = string.format('%d', due)
    start = bucket_of(index, due)
    if not start then
      -- Due before every bucket: the first bucket moves its start down when it
      -- has room (jobs enqueued in falling due order still share buckets).
      start = due_s
      local first = redis.call('ZRANGE', index, 0, 0)
      if first[1] and redis.call('ZCARD', bucket_key(prefix, first[1])) < BUCKET_CAP then
        redis.call('RENAME', bucket_key(prefix, first[1]), bucket_key(prefix, start))
        redis.call('ZREM', index, first[1])
      end
      redis.call('ZADD', index, due_s, start)
    end
    bkey = bucket_key(prefix, start)
    redis.call('ZADD', bkey, due_s, id)
    n = redis.call('ZCARD', bkey)
    uniform = false
    if memo then memo.due_s = due_s end
  end
  local split = false
  -- A bucket that failed to split holds one due time only; more of that due
  -- time keep it so, and are not probed again.
  if n > BUCKET_CAP and not uniform then
    split = bucket_split(prefix, index, start, bkey, n, due) or false
    uniform = not split
  end
  if memo then
    memo.start, memo.bkey, memo.n, memo.uniform = start, bkey, n, uniform
    memo.due = due
    -- After a split the bucket of `due` may be the new one: forget it.
    if split then memo.due = nil end
  end
end

-- Removes an id from the backlog. Returns 1 when removed.
local function backlog_remove(prefix, index, id, due)
  local start = bucket_of(index, due)
  if not start then return 0 end
  local bkey = bucket_key(prefix, start)
  local n = redis.call('ZREM', bkey, id)
  if n == 1 and redis.call('EXISTS', bkey) == 0 then
    redis.call('ZREM', index, start)
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
local function to_retry(prefix, index, ready, stats, id, rec, now, delay, reason)
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
  backlog_add(prefix, index, id, due)
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
local function remove_job(prefix, k_index, k_ready, k_leased, k_dead, k_done, k_exp, k_stats, id)
  local rec = load(prefix, id)
  if not rec then return 0, '' end
  local st = rec[R_STATE]
  if st == S_SCHEDULED then
    if backlog_remove(prefix, k_index, id, rec[R_DUE]) == 1 then
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
  drop(prefix, id)
  if st == S_LEASED then return st, rec[R_TOKEN], rec end
  return st, '', rec
end
