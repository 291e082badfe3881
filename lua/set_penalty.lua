-- set_penalty.lua: impose or lift a penalty by hand (admin API), e.g. after
-- WeChat's clear_quota. Lifting also ends the escalation (answers to calls
-- sent before the lift cannot re-impose it) and lowered windows. Mirrors src/store/op/set_penalty.rs.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  penalty length in microseconds; 0 lifts the penalty
--
-- Returns {until, now}.

local now = store_now(ARGV[1])
local len = tonumber(ARGV[2])
local untl = 0
if len > 0 then untl = now + len end
local st = state_read(KEYS[1])
st.pu, st.ps, st.pl, st.pn = untl, now, 0, len
-- A lift also makes windows a frequency 45009 lowered whole again
-- (lua/lower_windows.lua): the operator says WeChat takes calls again.
if len == 0 then
  local lowered = {}
  for f in pairs(st) do
    if string.match(f, '^w%d+%.l[nktbauh]$') then lowered[#lowered + 1] = f end
  end
  for _, f in ipairs(lowered) do st[f] = nil end
end
local ms = math.floor((2 * len) / 1000) + 1000
local pttl = redis.call('PTTL', KEYS[1])
-- acquire.lua trusts `ex` instead of asking PTTL: keep it true.
if pttl < ms then st.ex = now + ms * 1000 end
state_write(KEYS[1], st)
if pttl < ms then redis.call('PEXPIRE', KEYS[1], ms) end
return {untl, now}
