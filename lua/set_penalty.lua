-- set_penalty.lua: impose or lift a penalty by hand (admin API), e.g. after
-- WeChat's clear_quota. Lifting also ends the escalation (answers to calls
-- sent before the lift cannot re-impose it) and lowered windows. Mirrors src/store/op/set_penalty.rs.
--
-- KEYS[1]  state hash: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  penalty length in microseconds; 0 lifts the penalty
--
-- Returns {until, now}.

local now = store_now(ARGV[1])
local len = tonumber(ARGV[2])
local untl = 0
if len > 0 then untl = now + len end
redis.call('HSET', KEYS[1], 'pu', fmt(untl), 'ps', fmt(now), 'pl', '0', 'pn', fmt(len))
-- A lift also makes windows a frequency 45009 lowered whole again
-- (lua/lower_windows.lua): the operator says WeChat takes calls again.
if len == 0 then
  local lowered = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.match(f, '^w%d+%.l[nktbau]$') then lowered[#lowered + 1] = f end
  end
  if #lowered > 0 then redis.call('HDEL', KEYS[1], unpack(lowered)) end
end
local ms = math.floor((2 * len) / 1000) + 1000
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('PEXPIRE', KEYS[1], ms)
  -- acquire.lua trusts `ex` instead of asking PTTL: keep it true.
  redis.call('HSET', KEYS[1], 'ex', fmt(now + ms * 1000))
end
return {untl, now}
