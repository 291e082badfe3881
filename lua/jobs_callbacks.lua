-- jobs_callbacks.lua: hands out one account's pending callbacks due by now
-- (JobStore::callbacks_due): each made due again after the lease and its
-- times handed out counted, so another instance takes it only after that.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  lease (µs)     ARGV[4]  most
--
-- Returns {{the job's hash (HGETALL), ...}, earliest pending callback or -1}.

local now = tonumber(ARGV[2])
local again = now + tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', B .. 'cbs', '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, id in ipairs(ids) do
  local k = jkey(id)
  if redis.call('EXISTS', k) == 1 then
    redis.call('HINCRBY', k, 'cbn', 1)
    redis.call('HSET', k, 'cbd', fmt(again))
    redis.call('ZADD', B .. 'cbs', again, id)
    out[#out + 1] = redis.call('HGETALL', k)
  else
    redis.call('ZREM', B .. 'cbs', id)
  end
end
return {out, callback_head()}
