-- raise_day.lua: quota_sync (src/ops/quota_sync.rs). WeChat reports more calls
-- of this state's API today than counted: the day count becomes the larger
-- of the two, never lower; calls reserved for tomorrow stay. Mirrors
-- src/limit/decide.rs (raise_day).
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<state>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  the count WeChat reports
--
-- Returns the day count before. A key without a TTL long enough to reach the
-- next local midnight gets one (never shortened).

local key = KEYS[1]
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local reported = tonumber(ARGV[3])
local today, nxt = period('day', now, off)
local st = state_read(key)
local p = st['day.p']
local used, next = 0, 0
if p then
  used, next = counts(p, st['day.n'] or 0, st['day.q'] or 0, today)
end
local raised = used
if reported > raised then raised = reported end
st['day.p'], st['day.n'], st['day.q'] = today, raised, next
state_write(key, st)
local want = idiv(nxt - now, 1000) + 1000
local pttl = redis.call('PTTL', key)
if pttl >= 0 and pttl < want or pttl == -1 then
  redis.call('PEXPIRE', key, fmt(want))
end
return used
