-- jobs_claim.lua: leases the first due jobs of one queue to a dispatcher,
-- in seq order, stopping at the first job not due, claimed or sending
-- (JobStore::claim).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  owner     ARGV[4]  lease (µs)
-- ARGV[5]  most jobs                   ARGV[6]  caller    ARGV[7]  rule
--
-- Returns {queue head after, {each claimed job's HGETALL, then its body}}.

local now = tonumber(ARGV[2])
local owner, caller, rule = ARGV[3], ARGV[6], ARGV[7]
local untl = now + tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local out = {}
if max >= 1 then
  local ids = redis.call('ZRANGE', qkey(caller, rule), 0, max - 1)
  for _, id in ipairs(ids) do
    local k = jkey(id)
    local f = redis.call('HMGET', k, 'st', 'due')
    if (f[1] ~= 'queued' and f[1] ~= 'waiting') or tonumber(f[2]) > now then
      break
    end
    redis.call('HSET', k, 'st', 'claimed', 'o', owner, 'l', fmt(untl), 'up', fmt(now))
    redis.call('ZADD', B .. 'leases', untl, id)
    count(caller, rule, f[1], -1)
    count(caller, rule, 'claimed', 1)
    out[#out + 1] = redis.call('HGETALL', k)
    out[#out + 1] = redis.call('GET', bkey(id))
  end
end
return {head(caller, rule), out}
