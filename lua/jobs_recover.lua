-- jobs_recover.lua: leases of one account that ran out by now: claimed
-- jobs back to queued (never sent), sending jobs ended unknown (their
-- request may have reached WeChat: never sent again) (JobStore::recover).
-- Also reports every queue's head and every caller's totals, from which
-- the client repairs the cross-account index and totals.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  most leases this run
--
-- Returns {requeued, unknown, more (0/1), {caller, rule, head, ...},
-- {caller, jobs, bytes, ...}, earliest pending callback or -1, earliest
-- deadline or -1}.

local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', B .. 'leases', '-inf', fmt(now), 'LIMIT', 0, limit)
local requeued, unknown = 0, 0
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', jkey(id), 'st', 'c', 'r')
  if f[1] == 'claimed' then
    unlease(id, f[2], f[3], 'claimed', 'queued', tonumber(redis.call('HGET', jkey(id), 'due')), now)
    requeued = requeued + 1
  elseif f[1] == 'sending' then
    end_job(id, f[2], f[3], 'sending', 'unknown', now)
    unknown = unknown + 1
  else
    redis.call('ZREM', B .. 'leases', id)
  end
end
local heads = {}
for _, q in ipairs(redis.call('SMEMBERS', B .. 'qs')) do
  local caller, rule = string.match(q, '^(.-)\n(.*)$')
  heads[#heads + 1] = caller
  heads[#heads + 1] = rule
  heads[#heads + 1] = head(caller, rule, now)
end
local totals = {}
local m = redis.call('HGETALL', META)
for i = 1, #m, 2 do
  local caller = string.match(m[i], '^j:(.*)$')
  if caller then
    local j, b = caller_totals(caller)
    totals[#totals + 1] = caller
    totals[#totals + 1] = j
    totals[#totals + 1] = b
  end
end
return {requeued, unknown, #ids == limit and 1 or 0, heads, totals, callback_head(), deadline_head()}
