-- jobs_callback_done.lua: records the post of a callback handed out with
-- `tries` (JobStore::callback_done): done (no longer pending; the job is
-- then in 'ended' at the time it ended, for purge), or due again.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  the job's id
-- ARGV[4]  tries (as handed out)       ARGV[5]  due again at (µs), or '' for done
--
-- Returns {1 (recorded) or 0 (handed out again since, or not pending),
-- earliest pending callback or -1}.

local id = ARGV[3]
local k = jkey(id)
local f = redis.call('HMGET', k, 'cbd', 'cbn', 'up')
if not f[1] or f[2] ~= ARGV[4] then
  return {0, callback_head()}
end
if ARGV[5] ~= '' then
  redis.call('HSET', k, 'cbd', ARGV[5])
  redis.call('ZADD', B .. 'cbs', tonumber(ARGV[5]), id)
else
  redis.call('HDEL', k, 'cbd')
  redis.call('ZREM', B .. 'cbs', id)
  redis.call('ZADD', B .. 'ended', tonumber(f[3]), id)
end
return {1, callback_head()}
