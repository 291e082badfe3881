-- jobs_sending.lua: a claimed job whose owner still holds its lease
-- becomes sending, its attempt counted, before its request goes out
-- (JobStore::sending). On a master with replicas the client then makes
-- sure a replica has that mark before the request goes (`WAIT` after this
-- script, on the same connection: src/jobs/redis/sending.rs), and takes it
-- back when none has it in time (the request never went).
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  the job's id     ARGV[4]  owner
-- ARGV[5]  'mark': claimed -> sending (not when the lease ran out);
--          'check': still sending by owner? then a write, so that a `WAIT`
--            after it on this connection covers the mark, whichever
--            connection wrote it;
--          'undo': sending -> claimed again, the attempt uncounted (no
--            replica had the mark in time, and the request did not go).
--
-- Returns {done, replicas, replid}: done 1, or 0 (not claimed, or not
-- sending, by owner: not to be sent); for 'mark' and 'check', the replicas
-- this master has online and its replication id (a promoted replica, or a
-- master restarted empty, has another), read by INFO after the writes.

local now = tonumber(ARGV[2])
local k = jkey(ARGV[3])
local what = ARGV[5]
local f = redis.call('HMGET', k, 'st', 'o', 'l', 'c', 'r')

local function master()
  local info = redis.call('INFO', 'replication')
  local online = 0
  for _ in string.gmatch(info, 'state=online') do
    online = online + 1
  end
  return {1, online, string.match(info, 'master_replid:(%w+)') or ''}
end

if what == 'mark' then
  if f[1] ~= 'claimed' or f[2] ~= ARGV[4] or tonumber(f[3]) <= now then
    return {0, 0, ''}
  end
  redis.call('HSET', k, 'st', 'sending', 'up', fmt(now))
  redis.call('HINCRBY', k, 'at', 1)
  count(f[4], f[5], 'claimed', -1)
  count(f[4], f[5], 'sending', 1)
  return master()
end
if f[1] ~= 'sending' or f[2] ~= ARGV[4] then
  return {0, 0, ''}
end
if what == 'check' then
  redis.call('HSET', k, 'up', fmt(now))
  return master()
end
if what == 'undo' then
  redis.call('HSET', k, 'st', 'claimed', 'up', fmt(now))
  redis.call('HINCRBY', k, 'at', -1)
  count(f[4], f[5], 'sending', -1)
  count(f[4], f[5], 'claimed', 1)
  return {1, 0, ''}
end
return redis.error_reply('jobs_sending.lua: ARGV[5] is mark, check or undo')
