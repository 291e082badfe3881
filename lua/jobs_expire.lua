-- jobs_expire.lua: ends as expired one account's jobs no dispatcher holds
-- (queued, waiting) whose deadline is now or earlier, earliest first,
-- wherever they are in their queue (JobStore::expire). A claimed or sending
-- job is its holder's to end: it stays in 'dl' until it ends.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  most jobs to end
--
-- Returns {{id, caller, rule, submitted (µs), ...}, {caller, rule, queue
-- head, ...} of the queues that changed, {caller, jobs, bytes, ...} of
-- the callers that changed, earliest pending callback or -1 (-2: none
-- became pending), earliest deadline left or -1}.

local now = tonumber(ARGV[2])
local most = tonumber(ARGV[3])
local ended, heads, totals = {}, {}, {}
local queues, callers = {}, {}
local called = false
local ids = redis.call('ZRANGEBYSCORE', B .. 'dl', '-inf', ARGV[2], 'LIMIT', 0, most + 256)
for _, id in ipairs(ids) do
  if #ended >= 4 * most then
    break
  end
  local f = redis.call('HMGET', jkey(id), 'st', 'c', 'r', 'sub')
  if not f[1] or not unfinished(f[1]) then
    redis.call('ZREM', B .. 'dl', id)
  elseif f[1] == 'queued' or f[1] == 'waiting' then
    if end_job(id, f[2], f[3], f[1], 'expired', now) then
      called = true
    end
    ended[#ended + 1] = id
    ended[#ended + 1] = f[2]
    ended[#ended + 1] = f[3]
    ended[#ended + 1] = tonumber(f[4])
    queues[f[2] .. '\n' .. f[3]] = {f[2], f[3]}
    callers[f[2]] = true
  end
end
for _, q in pairs(queues) do
  heads[#heads + 1] = q[1]
  heads[#heads + 1] = q[2]
  heads[#heads + 1] = lower_head(q[1], q[2], now)
end
for caller in pairs(callers) do
  local j, b = caller_totals(caller)
  totals[#totals + 1] = caller
  totals[#totals + 1] = j
  totals[#totals + 1] = b
end
return {ended, heads, totals, callback_note(called), deadline_head()}
