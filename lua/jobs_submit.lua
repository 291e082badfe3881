-- jobs_submit.lua: stores a job at the end of its queue, or finds the job
-- its Idempotency-Key names, or refuses it whole (JobStore::submit).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B            ARGV[2]  now (µs)      ARGV[3]  the new job's id
-- ARGV[4]  caller       ARGV[5]  rule          ARGV[6]  domain
-- ARGV[7]  method       ARGV[8]  target        ARGV[9]  '=' .. content type, or ''
-- ARGV[10] body         ARGV[11] deadline (µs) or ''
-- ARGV[12] '=' .. Idempotency-Key, or ''      ARGV[13] '=' .. callback, or ''
-- ARGV[14..17] bounds: caller jobs, caller bytes, account jobs, account bytes
-- ARGV[18] idempotency_us
-- ARGV[19], ARGV[20] the caller's unfinished jobs and bytes in its other
--          accounts (as the client last saw them: the caller bound is
--          approximate by the submissions in flight elsewhere)
-- ARGV[21] '=' .. the submitting call's traceparent, or ''
-- ARGV[22] its lanes (src/jobs.rs Lanes)
-- ARGV[23] Bounds::ended_jobs (kept in meta for every end: jobs_prelude.lua kept())
--
-- Returns {'ok', id, caller jobs here, caller bytes here, queue head,
-- earliest deadline or -1 (-2: the job has none, nothing changed)},
-- {'dup', id}, or {'full', bound}.

local now = tonumber(ARGV[2])
local id, caller, rule = ARGV[3], ARGV[4], ARGV[5]
local body = ARGV[10]
local ik = ARGV[12]
local member
if ik ~= '' then
  member = caller .. '\n' .. string.sub(ik, 2)
  local first = redis.call('HGET', B .. 'idem', member)
  if first then
    local untl = tonumber(redis.call('ZSCORE', B .. 'idemx', member) or '0')
    if untl > now then
      return {'dup', first}
    end
  end
end

local size = #body
local m = redis.call('HMGET', META, 'j', 'b', 'j:' .. caller, 'b:' .. caller)
local aj, ab = tonumber(m[1] or '0'), tonumber(m[2] or '0')
local cj, cb = tonumber(m[3] or '0'), tonumber(m[4] or '0')
if cj + tonumber(ARGV[19]) + 1 > tonumber(ARGV[14]) then
  return {'full', 'caller_jobs'}
end
if cb + tonumber(ARGV[20]) + size > tonumber(ARGV[15]) then
  return {'full', 'caller_bytes'}
end
if aj + 1 > tonumber(ARGV[16]) then
  return {'full', 'account_jobs'}
end
if ab + size > tonumber(ARGV[17]) then
  return {'full', 'account_bytes'}
end

local seq = redis.call('HINCRBY', META, 'seq', 1)
redis.call('HSET', META, 'kept', ARGV[23])
redis.call('HINCRBY', META, 'n', 1)
redis.call('HINCRBY', META, 'j', 1)
redis.call('HINCRBY', META, 'b', size)
redis.call('HINCRBY', META, 'j:' .. caller, 1)
redis.call('HINCRBY', META, 'b:' .. caller, size)

local k = jkey(id)
local t = fmt(now)
redis.call('HSET', k, 'id_', id, 'c', caller, 'r', rule, 'dom', ARGV[6], 'm', ARGV[7], 'tg', ARGV[8],
  'sz', size, 'seq', seq, 'st', 'queued', 'sub', t, 'due', t, 'l', '0', 'at', '0', 'up', t, 'ln', ARGV[22] or '*')
if ARGV[9] ~= '' then
  redis.call('HSET', k, 'ct', string.sub(ARGV[9], 2))
end
local deadlines = -2
if ARGV[11] ~= '' then
  redis.call('HSET', k, 'dl', ARGV[11])
  redis.call('ZADD', B .. 'dl', ARGV[11], id)
  deadlines = deadline_head()
end
if ik ~= '' then
  redis.call('HSET', k, 'ik', string.sub(ik, 2))
  redis.call('HSET', B .. 'idem', member, id)
  redis.call('ZADD', B .. 'idemx', now + tonumber(ARGV[18]), member)
end
if ARGV[13] ~= '' then
  redis.call('HSET', k, 'cb', string.sub(ARGV[13], 2))
end
if (ARGV[21] or '') ~= '' then
  redis.call('HSET', k, 'tp', string.sub(ARGV[21], 2))
end
redis.call('SET', bkey(id), body)
redis.call('ZADD', qkey(caller, rule), seq, id)
redis.call('SADD', B .. 'qs', caller .. '\n' .. rule)
count(caller, rule, 'queued', 1)
return {'ok', id, cj + 1, cb + size, lower_head(caller, rule, now), deadlines}
