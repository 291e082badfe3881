-- jobs_purge.lua: deletes one account's jobs that ended before a time,
-- and its Idempotency-Keys past their time (JobStore::purge). When the
-- account has no job and no key left, its remaining keys go too (the
-- counter of seq starts again: seq orders only unfinished jobs).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  delete jobs ended before this (µs)
-- ARGV[4]  most jobs (and most keys) this run
--
-- Returns {jobs deleted, more (0/1), {callers whose totals here are gone}}.

local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[4])
local ids = redis.call('ZRANGEBYSCORE', B .. 'ended', '-inf', '(' .. ARGV[3], 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'c', 'r', 'st')
  if f[1] then
    count(f[1], f[2], f[3], -1)
    redis.call('DEL', k, bkey(id))
    redis.call('HINCRBY', META, 'n', -1)
  end
  redis.call('ZREM', B .. 'ended', id)
end
local keys = redis.call('ZRANGEBYSCORE', B .. 'idemx', '-inf', fmt(now), 'LIMIT', 0, limit)
for _, member in ipairs(keys) do
  redis.call('HDEL', B .. 'idem', member)
  redis.call('ZREM', B .. 'idemx', member)
end
local gone = {}
if tonumber(redis.call('HGET', META, 'n') or '0') <= 0 and redis.call('EXISTS', B .. 'idemx') == 0 then
  local m = redis.call('HGETALL', META)
  for i = 1, #m, 2 do
    local caller = string.match(m[i], '^j:(.*)$')
    if caller then
      gone[#gone + 1] = caller
    end
  end
  redis.call('DEL', META, B .. 'counts', B .. 'ended', B .. 'leases', B .. 'idem', B .. 'qs')
end
local more = (#ids == limit or #keys == limit) and 1 or 0
return {#ids, more, gone}
