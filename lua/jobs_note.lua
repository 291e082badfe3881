-- jobs_note.lua: after a script on an account's jobs, what it reported
-- into the keys that span accounts (src/store/jobs/redis.rs): queues'
-- heads in the index of due queues, and callers' unfinished jobs and bytes
-- in that account. Sets values, never adds: running it twice, or late,
-- writes the same (a late one may undo a newer one: the module docs say
-- what that costs and what repairs it).
--
-- The index of due queues is per caller (jobs_due.lua reads it):
--   <prefix>:{#jobs}:due:<caller>   zset account\nrule -> the queue's head
--                                   due time (µs)
--   <prefix>:{#jobs}:due-callers    zset caller -> the lowest score of its
--                                   due:<caller> (absent when that is empty)
-- Both are written here only, together, so they agree with each other.
--
-- KEYS[1]          <prefix>:{#jobs}:due-callers
-- KEYS[2..H+1]     <prefix>:{#jobs}:due:<caller>, one per head below, in order
-- KEYS[H+2..]      <prefix>:{#jobs}:caller:<caller>, one per caller's totals
--                  below: hash account -> "<jobs> <bytes>"
-- ARGV[1]    the account
-- ARGV[2]    H, how many heads follow: H times caller, rule, the head's
--            due time or -1 (no due head: out of the index)
-- then, for each of KEYS[H+2..] in order: jobs, bytes (both 0: out)
--
-- Returns 1.

local account = ARGV[1]
local h = tonumber(ARGV[2])
local i = 3
for n = 1, h do
  local caller, due = ARGV[i], KEYS[1 + n]
  local member = account .. '\n' .. ARGV[i + 1]
  if tonumber(ARGV[i + 2]) < 0 then
    redis.call('ZREM', due, member)
  else
    redis.call('ZADD', due, ARGV[i + 2], member)
  end
  local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', KEYS[1], caller)
  else
    redis.call('ZADD', KEYS[1], first[2], caller)
  end
  i = i + 3
end
for k = h + 2, #KEYS do
  local jobs, bytes = ARGV[i], ARGV[i + 1]
  if tonumber(jobs) <= 0 and tonumber(bytes) <= 0 then
    redis.call('HDEL', KEYS[k], account)
  else
    redis.call('HSET', KEYS[k], account, jobs .. ' ' .. bytes)
  end
  i = i + 2
end
return 1
