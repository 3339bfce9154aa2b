-- clock.lua: "now" is Redis TIME unless the caller passes an explicit clock (tests).
-- Redis' clock in µs (TIME advances within a script; enqueue.lua times itself by it).
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- `us`: a clock_us() the caller already read, so a call reads TIME once.
local function now_ms(arg, us)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  return math.floor((us or clock_us()) / 1000)
end
