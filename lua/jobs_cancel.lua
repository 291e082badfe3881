-- jobs_cancel.lua: cancels a job of a caller that is queued, waiting or
-- claimed (JobStore::cancel): a claimed job's dispatcher then finds it
-- gone (jobs_sending.lua answers 0) and never sends it.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  the job's id     ARGV[4]  caller
--
-- Returns {'none'} (no job of this caller), {'late', state}, or
-- {'ok', rule, queue head, caller's jobs, caller's bytes, earliest pending
-- callback or -1 (-2: no callback became pending)}.

local now = tonumber(ARGV[2])
local id, caller = ARGV[3], ARGV[4]
local f = redis.call('HMGET', jkey(id), 'st', 'c', 'r')
if not f[1] or f[2] ~= caller then
  return {'none'}
end
if f[1] ~= 'queued' and f[1] ~= 'waiting' and f[1] ~= 'claimed' then
  return {'late', f[1]}
end
local called = end_job(id, caller, f[3], f[1], 'cancelled', now)
local cj, cb = caller_totals(caller)
return {'ok', f[3], lower_head(caller, f[3], now), cj, cb, callback_note(called)}
