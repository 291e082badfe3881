-- succeeded.lua: WeChat answered a call without a penalised errcode; end the
-- penalty escalation. The same logic as src/limit/penalty.rs (succeeded).
--
-- KEYS[1]  state hash: <prefix>:{<account>}:<rule>
-- ARGV[1]  when the answered call was admitted (store time, from acquire.lua)
--
-- Returns 1 if the escalation ended, 0 if the answer was stale (the call was
-- admitted before the current penalty began) or there was no state.

local ps = redis.call('HGET', KEYS[1], 'ps')
if not ps then return 0 end
if tonumber(ARGV[1]) < (tonumber(ps) or 0) then return 0 end
redis.call('HSET', KEYS[1], 'pl', '0', 'pn', '0')
return 1
