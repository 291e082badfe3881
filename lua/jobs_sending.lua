-- jobs_sending.lua: a claimed job whose owner still holds its lease
-- becomes sending, its attempt counted, before its request goes out
-- (JobStore::sending).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  the job's id     ARGV[4]  owner
--
-- Returns 1, or 0 (not claimed by owner, or its lease ran out: not to be sent).

local now = tonumber(ARGV[2])
local k = jkey(ARGV[3])
local f = redis.call('HMGET', k, 'st', 'o', 'l', 'c', 'r')
if f[1] ~= 'claimed' or f[2] ~= ARGV[4] or tonumber(f[3]) <= now then
  return 0
end
redis.call('HSET', k, 'st', 'sending', 'up', fmt(now))
redis.call('HINCRBY', k, 'at', 1)
count(f[4], f[5], 'claimed', -1)
count(f[4], f[5], 'sending', 1)
return 1
