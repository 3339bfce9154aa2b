-- clock.lua: "now" is Redis TIME unless the caller passes an explicit clock (tests).
local function now_ms(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The same, with the microseconds past that ms (-1 for an explicit clock): a
-- caller that plans wake-ups by Redis' clock then knows it to the µs (issue 12).
local function now_ms_us(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n, -1 end
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end
