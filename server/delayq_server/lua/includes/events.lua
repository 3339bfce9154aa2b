-- events.lua: lifecycle events (names and fields: store/lifecycle.py).
-- A script that includes this takes the events stream's MAXLEN as its LAST
-- argument (0 = recording off, the default; server flag --record-events), and
-- calls emit() at each transition, in the same script as the change: an event
-- is written exactly when its transition is. The stream <prefix>ev shares the
-- shard's hash tag; MAXLEN ~ keeps it bounded (approximate trimming is O(1)).
local ev_maxlen = tonumber(ARGV[#ARGV]) or 0

local function emit(prefix, kind, id, now, rec, reason)
  if ev_maxlen <= 0 then return end
  redis.call('XADD', prefix .. 'ev', 'MAXLEN', '~', ev_maxlen, '*',
    'e', kind, 'j', id, 't', string.format('%d', now),
    'd', string.format('%d', rec and rec[R_DUE] or 0),
    'c', string.format('%d', rec and rec[R_CREATED] or 0),
    'a', rec and rec[R_ATTEMPTS] or 0, 'r', reason or '')
end
