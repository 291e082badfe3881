-- jobs_claim.lua: leases to a dispatcher the first due jobs of one queue
-- whose lanes are free (no earlier unfinished job shares one), in seq
-- order (JobStore::claim; the walk is jobs_prelude.lua's `scan`).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  owner     ARGV[4]  lease (µs)
-- ARGV[5]  most jobs                   ARGV[6]  caller    ARGV[7]  rule
-- ARGV[8]  most unfinished jobs looked at
--
-- Returns {queue head after (the earliest due time of a free job left, or
-- -1), {each claimed job's HGETALL, then its body}}.

local now = tonumber(ARGV[2])
local owner, caller, rule = ARGV[3], ARGV[6], ARGV[7]
local untl = now + tonumber(ARGV[4])
local out = {}
local function pick(id, k, state)
  redis.call('HSET', k, 'st', 'claimed', 'o', owner, 'l', fmt(untl), 'up', fmt(now))
  redis.call('ZADD', B .. 'leases', untl, id)
  count(caller, rule, state, -1)
  count(caller, rule, 'claimed', 1)
  out[#out + 1] = redis.call('HGETALL', k)
  out[#out + 1] = redis.call('GET', bkey(id))
end
local nxt = scan(caller, rule, now, tonumber(ARGV[5]), tonumber(ARGV[8]), pick)
return {set_head(caller, rule, nxt), out}
