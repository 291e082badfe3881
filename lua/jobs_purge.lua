-- jobs_purge.lua: deletes one account's jobs that ended before a time
-- (but those an Idempotency-Key still names), and its Idempotency-Keys
-- past their time (JobStore::purge). When the
-- account has no job and no key left, its remaining keys go too (the
-- counter of seq starts again: seq orders only unfinished jobs).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  delete jobs ended before this (µs)
-- ARGV[4]  most jobs (and most keys) this run
--
-- Returns {jobs deleted, more (0/1), {callers whose totals here are gone}}.

local now = tonumber(ARGV[2])
local keep = now - tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local ids = redis.call('ZRANGEBYSCORE', B .. 'ended', '-inf', '(' .. ARGV[3], 'LIMIT', 0, limit)
local deleted = 0
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', jkey(id), 'c', 'ik')
  local untl = false
  if f[1] and f[2] then
    -- An Idempotency-Key that still counts keeps its job (a repeat finds
    -- it, never a new one): back in 'ended' to come out at the first purge
    -- at or after the key's time (as src/jobs/sqlite.rs PURGE).
    local member = f[1] .. '\n' .. f[2]
    if redis.call('HGET', B .. 'idem', member) == id then
      untl = tonumber(redis.call('ZSCORE', B .. 'idemx', member) or '0')
      if untl <= now then
        untl = false
      end
    end
  end
  if untl then
    redis.call('ZADD', B .. 'ended', untl - keep - 1, id)
  elseif f[1] then
    forget(id, f[1])
    deleted = deleted + 1
  else
    redis.call('ZREM', B .. 'ended', id)
  end
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
return {deleted, more, gone}
