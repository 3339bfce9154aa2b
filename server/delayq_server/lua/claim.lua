-- claim.lua: lease up to `count` ready jobs to one Consume stream.
-- KEYS[1] ready   LIST  job ids due now
-- KEYS[2] leased  ZSET  job id -> lease deadline ms
-- KEYS[3] stats   HASH  counters
-- KEYS[4] exp     ZSET  job id -> expire ms
-- KEYS[5] dead    ZSET  job id -> time of death ms
-- KEYS[6] paused  STRING  present while the queue is paused: nothing is claimed
-- KEYS[7] index   ZSET  backlog bucket start ms (includes/record.lua)
-- ARGV[1] prefix, ARGV[2] now ms ('' = Redis TIME), ARGV[3] count (<= CLAIM_LIMIT, store.py),
-- ARGV[4] lease ms, ARGV[5] nonce prefix (the stream's; a counter is appended),
-- ARGV[6] shard channel (SPUBLISH) (publishes "<prefix> lease <deadline>" for the reaper),
-- ARGV[7] randomness: 16 hex chars per job (count * 16), from the server's CSPRNG,
-- ARGV[8] events MAXLEN, always the last argument (0 = off; lua/includes/events.lua)
-- Returns: {now, next due ms in the backlog (-1: none, -2: not read, paused), then per
--   leased job: id, nonce, packed record}
-- Due jobs are promoted here first, as many as the ready list lacks for `count`,
-- so a stream that the promoter woke at a due time takes its jobs in this one
-- call: no promote call and no "ready" event in between (issue 12, timer CPU).
-- All it promotes it leases at once (or drops: TTL, attempts), so it announces
-- nothing; the next due time goes back to this replica's promoter.
-- Each lease gets a fresh nonce stored in the record: that is the fence that
-- makes Ack/Nack/ExtendLease with an older token fail. The nonce ends in 64
-- random bits (issue 9), so no lease token can be predicted from another: the
-- prefix only routes credit back to the stream (server id and stream seq).
-- Jobs past their TTL are dropped here and counted, never delivered.
-- KEYS[8] the call's request key (includes/replay.lua). A re-sent claim (its
-- reply was lost) answers the leases the first run took, re-read from their
-- records, so no lease is left that no stream knows of. Only ids and nonces are
-- kept for the replay, never the records (payloads can be large).
local k_ready, k_leased, k_stats, k_exp, k_dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_paused, k_index = KEYS[6], KEYS[7]
local prefix, count, lease, nonce_prefix = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local channel, random = ARGV[6], ARGV[7]
-- @include record
-- @include events
-- @include replay
local prev = replay_get()
if prev then
  local out = {prev[1], backlog_head(prefix, k_index) or -1}
  for i = 2, #prev, 2 do
    local id, nonce = prev[i], prev[i + 1]
    local raw = load_raw(prefix, id)
    if raw then
      local rec = cmsgpack.unpack(raw)
      -- Still this lease: not reaped, acked or deleted since (it cannot have
      -- been acked by the stream, which never saw it).
      if rec[R_STATE] == S_LEASED and rec[R_TOKEN] == nonce then
        table.insert(out, id)
        table.insert(out, nonce)
        table.insert(out, raw)
      end
    end
  end
  return out
end
local now = now_ms(ARGV[2])
-- Paused (PauseQueue, issue 14): claim nothing; the stream sees a short claim
-- and waits idle until pause.lua's resume publishes "ready".
-- It reports no next due time (-2): the promoter then promotes on its own.
if redis.call('EXISTS', k_paused) == 1 then return {now, -2} end
local lacking = count - redis.call('LLEN', k_ready)
if lacking > 0 then
  local moved = promote_due(prefix, k_index, k_ready, now, lacking)
  if moved > 0 then redis.call('HINCRBY', k_stats, 'backlog', -moved) end
end
local out = {now, backlog_head(prefix, k_index) or -1}
local kept = {now}
local ids = redis.call('RPOP', k_ready, count)
-- Nothing leased: a re-run is a fresh claim, harmless, so nothing is kept.
if not ids then return out end
local head = redis.call('ZRANGE', k_leased, 0, 0, 'WITHSCORES')
for i, id in ipairs(ids) do
  local rec = load(prefix, id)
  if rec then
    if rec[R_EXPIRE] > 0 and rec[R_EXPIRE] <= now then
      drop(prefix, id)
      redis.call('ZREM', k_exp, id)
      redis.call('HINCRBY', k_stats, 'expired', 1)
      emit(prefix, 'expired', id, now, rec, 'ttl')
    elseif rec[R_ATTEMPTS] >= rec[R_MAX] then
      to_dead(prefix, k_dead, k_stats, id, rec, now, 'attempts exhausted')
      emit(prefix, 'dead', id, now, rec, 'attempts exhausted')
    else
      local nonce = nonce_prefix .. i .. '.' .. string.sub(random, i * 16 - 15, i * 16)
      rec[R_STATE] = S_LEASED
      rec[R_ATTEMPTS] = rec[R_ATTEMPTS] + 1
      rec[R_LASTDEL] = now
      rec[R_TOKEN] = nonce
      local packed = cmsgpack.pack(rec)
      save_raw(prefix, id, packed)
      redis.call('ZADD', k_leased, now + lease, id)
      emit(prefix, 'delivered', id, now, rec, '')
      table.insert(out, id)
      table.insert(out, nonce)
      table.insert(out, packed)
      table.insert(kept, id)
      table.insert(kept, nonce)
    end
  end
end
-- The shard's reaper (on whichever replica owns the shard) sleeps until the
-- earliest deadline it knows: tell it when this claim made an earlier one.
if #out > 2 and (not head[2] or now + lease < tonumber(head[2])) then
  redis.call('SPUBLISH', channel, prefix .. ' lease ' .. string.format('%d', now + lease))
end
if #kept > 1 then replay_put(kept) end
return out
