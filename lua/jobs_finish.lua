-- jobs_finish.lua: ends an attempt of a job its owner holds, claimed or
-- sending (JobStore::finish). A lease that ran out but was not yet
-- recovered still holds: nobody else can have the job until jobs_recover.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  the job's id     ARGV[4]  owner
-- ARGV[5]  sent | failed | retry | notyet | expired | unknown
-- ARGV[6]  retry, notyet: due at (µs): queued if that is now or past, else waiting
-- ARGV[7]  '1' with an answer, else ''; ARGV[8] its status, ARGV[9] its
--          errcode or '', ARGV[10] its body
--
-- Returns {0} (owner does not hold it, or notyet / expired for a sending
-- job: nothing changed), or {1, caller, rule, queue head,
-- caller's jobs, caller's bytes, earliest pending callback or -1 (-2: no
-- callback became pending)}.

local now = tonumber(ARGV[2])
local id = ARGV[3]
local k = jkey(id)
local f = redis.call('HMGET', k, 'st', 'o', 'c', 'r')
local kind = ARGV[5]
if (f[1] ~= 'claimed' and f[1] ~= 'sending') or f[2] ~= ARGV[4] then
  return {0}
end
-- Not yet and expired say the job was never sent: a sending job may have
-- been, so it is not handed back or called expired (it ends sent, failed,
-- retried on the dispatcher's word, or unknown).
if f[1] == 'sending' and (kind == 'notyet' or kind == 'expired') then
  return {0}
end
local caller, rule = f[3], f[4]
if ARGV[7] == '1' then
  redis.call('HSET', k, 'as', ARGV[8], 'ab', ARGV[10])
  if ARGV[9] ~= '' then
    redis.call('HSET', k, 'ae', ARGV[9])
  else
    redis.call('HDEL', k, 'ae')
  end
end
local called = false
-- Its lanes freed (it ended), or it waits until `free` holding them.
local free = now
if kind == 'retry' or kind == 'notyet' then
  local due = tonumber(ARGV[6])
  unlease(id, caller, rule, f[1], due <= now and 'queued' or 'waiting', due, now)
  free = math.max(due, now)
else
  called = end_job(id, caller, rule, f[1], kind, now)
end
local cj, cb = caller_totals(caller)
return {1, caller, rule, lower_head(caller, rule, free), cj, cb, callback_note(called)}
