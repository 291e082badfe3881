-- jobs_renew.lua: extends the leases an owner holds on jobs of this
-- account, claimed or sending (a lease that ran out but was not yet
-- recovered included, as jobs_finish.lua takes it) (JobStore::renew).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  owner     ARGV[4]  until (µs)
-- ARGV[5..] the jobs' ids
--
-- Returns how many were extended.

local owner, untl = ARGV[3], ARGV[4]
local n = 0
for i = 5, #ARGV do
  local k = jkey(ARGV[i])
  local f = redis.call('HMGET', k, 'st', 'o')
  if (f[1] == 'claimed' or f[1] == 'sending') and f[2] == owner then
    redis.call('HSET', k, 'l', untl)
    redis.call('ZADD', B .. 'leases', untl, ARGV[i])
    n = n + 1
  end
end
return n
