-- enqueue.lua: store a batch of jobs for one shard.
-- KEYS[1] index   ZSET  backlog bucket start ms -> the same (includes/record.lua)
-- KEYS[2] ready   LIST  job ids due now (LPUSH in, RPOP out)
-- KEYS[3] stats   HASH  counters
-- KEYS[4] exp     ZSET  job id -> expire ms (jobs with a TTL only)
-- ARGV[1] prefix (dq:{ns/queue/shard}:), ARGV[2] now ms ('' = Redis TIME),
-- ARGV[3] this call's field in the batch's request key (its chunk number),
-- ARGV[4] idempotency window ms, ARGV[5] shard channel (SPUBLISH),
-- ARGV[6] job count n (<= 1000, enforced by the caller),
-- ARGV[7] the jobs: one msgpack array of n arrays of 12 fields each:
--   id, delay_ms (-1 when due_at is given), due_at ms (-1), ttl ms (0 none),
--   max_attempts, backoff init ms, backoff max ms, multiplier, jitter,
--   headers (msgpack map bytes), payload, idempotency key ('' none)
-- (one packed argument instead of 12 per job: argument encoding was a quarter
-- of the server's CPU per batched job)
-- ARGV[8] time budget of this call, µs of Redis' own clock from the script's
--   start (TIME advances within a script). Checked every 4 jobs: past it the
--   call stops, having stored at least 4 jobs, and the caller sends the rest in
--   a next call. The caller's cut (store/chunks.py) cannot foresee where due
--   times land: 100 jobs of one delay in the middle of existing buckets split
--   them and took up to 2.3 ms.
-- ARGV[9] events MAXLEN, always last (0 = off; lua/includes/events.lua)
-- Returns: {now, then per job stored: id, due ms (-1: a duplicate whose due time is
--   unknown), duplicate 0/1}: fewer jobs than n when the budget ran out.
-- Publishes "<prefix> ready" when the ready list was empty and got jobs, and
-- "<prefix> due <ms>" when the earliest due time moved earlier, so idle
-- dispatchers and promoters on every server replica wake at once.
-- Undeclared keys (records, buckets, idempotency) share KEYS' hash tag.
-- KEYS[5] the batch's request key (includes/replay.lua: a HASH, field ARGV[3]
-- per call, replay_hget/replay_hput). A re-sent call is
-- answered from a compact entry: "now", how many jobs the call took (its budget
-- may have stopped it) and the duplicates only (index, id, due); every stored
-- job's due time follows from its ARGV and that "now". The full
-- reply cost ~37 bytes per job for 30 s, a tenth of a job's memory.
local k_index, k_ready, k_stats, k_exp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = ARGV[1]
local field, idem_window, channel, n = ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local budget_us = tonumber(ARGV[8])
-- @include record
-- @include events
-- @include replay
local started = clock_us()  -- the budget's start, and "now" unless the caller set it
local jobs = cmsgpack.unpack(ARGV[7])

local function due_of(j, now)
  local due = now + j[2]
  if j[2] < 0 then due = j[3] end
  if due < now then due = now end
  return due
end

local prev = replay_hget(field)
if prev then
  local out, d = {prev[1]}, 3
  for i = 1, prev[2] do
    if prev[d] == i then
      table.insert(out, prev[d + 1])
      table.insert(out, prev[d + 2])
      table.insert(out, 1)
      d = d + 3
    else
      table.insert(out, jobs[i][1])
      table.insert(out, due_of(jobs[i], prev[1]))
      table.insert(out, 0)
    end
  end
  return out
end
local now = now_ms(ARGV[2], started)
local kept = {now, 0}

-- Read before the first LPUSH only: most calls store delayed jobs alone.
local was_empty = nil
local head_due = backlog_head(prefix, k_index)
local pushed, earliest, stored, delayed = 0, nil, 0, 0
local memo = {pend = {}}  -- backlog_add's bucket of the last due time (includes/record.lua)
local out = {now}
local taken = 0
for i = 0, n - 1 do
  if i % 4 == 0 and i > 0 and clock_us() - started >= budget_us then break end
  taken = i + 1
  local j = jobs[i + 1]
  local id, ttl = j[1], j[4]
  local ikey = j[12]
  local due = due_of(j, now)
  local existing, existing_due = nil, -1
  if ikey ~= '' then
    -- One command claims the key or reads the holder (SET NX GET, Redis 7.0). The
    -- key holds "<job id> <due ms>" so a duplicate is answered with its due time
    -- even after the job itself was acked or deleted.
    local prev = redis.call('SET', prefix .. 'idem:' .. ikey,
      id .. ' ' .. string.format('%d', due), 'NX', 'GET', 'PX', idem_window)
    if prev then
      local sp = string.find(prev, ' ', 1, true)
      if sp then
        existing, existing_due = string.sub(prev, 1, sp - 1), tonumber(string.sub(prev, sp + 1))
      else
        existing = prev  -- written before due times were kept with the id
      end
    end
  end
  if existing then
    local prec = load(prefix, existing)
    if prec then existing_due = prec[R_DUE] end
    table.insert(out, existing)
    table.insert(out, existing_due)
    table.insert(out, 1)
    table.insert(kept, i + 1)
    table.insert(kept, existing)
    table.insert(kept, existing_due)
  else
    local expire = 0
    if ttl > 0 then expire = now + ttl end
    local rec = {S_SCHEDULED, 0, j[5], due, now, expire, 0, 0, '', '',
      j[6], j[7], j[8], j[9], j[10], j[11]}
    if due <= now then
      rec[R_STATE] = S_READY
      save(prefix, id, rec)
      if was_empty == nil then was_empty = redis.call('LLEN', k_ready) == 0 end
      redis.call('LPUSH', k_ready, id)
      pushed = pushed + 1
    else
      save(prefix, id, rec)
      backlog_add(prefix, k_index, id, due, memo)
      delayed = delayed + 1
      if earliest == nil or due < earliest then earliest = due end
    end
    if expire > 0 then redis.call('ZADD', k_exp, expire, id) end
    stored = stored + 1
    emit(prefix, 'enqueued', id, now, rec, '')
    table.insert(out, id)
    table.insert(out, due)
    table.insert(out, 0)
  end
end
backlog_flush(memo)
if stored > 0 then redis.call('HINCRBY', k_stats, 'enqueued', stored) end
-- One counter update per call, not per job.
if delayed > 0 then redis.call('HINCRBY', k_stats, 'backlog', delayed) end
if pushed > 0 and was_empty then redis.call('SPUBLISH', channel, prefix .. ' ready ' .. pushed) end
if earliest and (head_due == nil or earliest < head_due) then
  redis.call('SPUBLISH', channel, prefix .. ' due ' .. string.format('%d', earliest))
end
kept[2] = taken
if stored > 0 then replay_hput(field, kept) end
return out
