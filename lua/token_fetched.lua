-- token_fetched.lua: the fetch an asker won (token_claim.lua) ended. A
-- token is cached whoever holds the lock now; the lock is released, or
-- replaced by the failed answer for its waiters, only by its holder.
-- Mirrors src/store/memory/token_slots.rs (fetched).
--
-- KEYS[1]  the slot's entry (see token_claim.lua)
-- KEYS[2]  its fetch lock
-- KEYS[3]  <prefix>:{#tokens}:by:<token hash>: the slot holding a token
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  the holder's id
-- ARGV[3]  token | failed | abandoned
-- ARGV[4]  token: the sealed token; failed: the answer
-- ARGV[5]  token: the token's hash (hex)
-- ARGV[6]  token: its lifetime, µs; failed: how long waiters see the answer, µs
-- ARGV[7]  the slot's name
--
-- Returns 1.

local now = store_now(ARGV[1])
local kind = ARGV[3]
local span = tonumber(ARGV[6])
local ms = idiv(span + 999, 1000)
if kind == 'token' then
  -- Stored later than the entry it replaces, even at the same clock reading.
  local stored = now
  local before = tonumber(redis.call('HGET', KEYS[1], 'f') or '')
  if before and before >= stored then stored = before + 1 end
  redis.call('HSET', KEYS[1], 'e', ARGV[4], 'u', fmt(now + span), 'f', fmt(stored), 'h', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], fmt(ms))
  redis.call('SET', KEYS[3], ARGV[7], 'PX', fmt(ms))
end
local l = redis.call('GET', KEYS[2])
local untl, holder = nil, nil
if l then
  untl, holder = string.match(l, '^(%d+):(.*)$')
end
if untl and tonumber(untl) > now and holder == ARGV[2] then
  if kind == 'failed' then
    redis.call('SET', KEYS[2], fmt(now + span) .. ':!' .. ARGV[4], 'PX', fmt(ms))
  else
    redis.call('DEL', KEYS[2])
  end
end
return 1
