-- renew.lua: extend the leases of some concurrency slots (a call still in
-- flight past half its lease). A slot already freed stays free (ZADD XX).
-- Mirrors the memory store's renew (src/store/op/renew.rs).
--
-- KEYS[1]  concurrency slots: <prefix>:{<account>}:<rule>:c
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  lease in microseconds
-- ARGV[3..] the holders whose slots are renewed
--
-- Returns the number of slots renewed.

local now = store_now(ARGV[1])
local lease = tonumber(ARGV[2])
local renewed = 0
local expiry = fmt(now + lease)
for i = 3, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], fmt(math.floor(lease / 1000) + 1000))
return renewed
