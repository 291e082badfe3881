-- succeeded.lua: WeChat answered a call without a penalised errcode; end the
-- penalty escalation. The same logic as src/limit/penalty.rs (succeeded).
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- ARGV[1]  when the answered call was admitted (store time, from acquire.lua)
--
-- Returns 1 if the escalation ended, 0 if the answer was stale (the call was
-- admitted before the current penalty began) or there was no state.

local st = state_read(KEYS[1])
local ps = st.ps
if not ps then return 0 end
if tonumber(ARGV[1]) < ps then return 0 end
st.pl, st.pn = 0, 0
state_write(KEYS[1], st)
return 1
