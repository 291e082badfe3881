-- penalise.lua: WeChat answered a penalised errcode; start or escalate the
-- (account, rule)'s penalty. The same logic as src/limit/penalty.rs
-- (PenaltyState::penalise, PenaltyPolicy::until), on the prelude's calendar.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, microseconds
-- ARGV[3]  "e" (escalating: base doubles while recent) or "m" (until next minute)
-- ARGV[4]  base length, microseconds (kind "e")
-- ARGV[5]  cap on one penalty, microseconds; 0 = until the next local midnight
-- ARGV[6]  when the answered call was admitted (store time, from acquire.lua)
--
-- Returns {until, now}. An answer to a call admitted before the current
-- penalty began changes nothing.

local key = KEYS[1]
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local kind, base, max, sent_at = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local st = state_read(key)
local pu, ps, pl, pn = st.pu or 0, st.ps or 0, st.pl or 0, st.pn or 0
if sent_at < ps then
  return {pu, now}
end

local level = 0
if kind == 'e' and pn > 0 and now < pu + pn then level = pl + 1 end
local cap
if max > 0 then
  cap = now + max
else
  cap = next_midnight(now, off)
end
local untl
if kind == 'm' then
  untl = next_minute(now, off)
else
  local lvl = level
  if lvl > 40 then lvl = 40 end
  untl = now + base * (2 ^ lvl)
end
if untl > cap then untl = cap end
if untl < pu then untl = pu end

st.pu, st.ps, st.pl, st.pn = untl, now, level, untl - now
local ms = math.floor((2 * (untl - now)) / 1000) + 1000
local pttl = redis.call('PTTL', key)
-- acquire.lua trusts `ex` instead of asking PTTL: keep it true.
if pttl < ms then st.ex = now + ms * 1000 end
state_write(key, st)
if pttl < ms then redis.call('PEXPIRE', key, ms) end
return {untl, now}
