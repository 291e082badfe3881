-- jobs_note.lua: after a script on an account's jobs, what it reported
-- into the keys that span accounts (src/store/jobs/redis.rs): a queue's
-- head in the index of due queues, and a caller's unfinished jobs and
-- bytes in that account. Sets values, never adds: running it twice, or
-- late, writes the same (a late one may undo a newer one: the module docs
-- say what that costs and what repairs it).
--
-- KEYS[1]  <prefix>:{#jobs}:due                zset account\ncaller\nrule -> head due (µs)
-- KEYS[2]  <prefix>:{#jobs}:caller:<caller>    hash account -> "<jobs> <bytes>"
-- ARGV[1]  account    ARGV[2]  caller    ARGV[3]  rule
-- ARGV[4]  the head's due time, -1 (no due head: out of the index), or '' (leave it)
-- ARGV[5]  the caller's jobs in the account, or '' (leave them)   ARGV[6]  its bytes
--
-- Returns 1.

if ARGV[4] ~= '' then
  local member = ARGV[1] .. '\n' .. ARGV[2] .. '\n' .. ARGV[3]
  if tonumber(ARGV[4]) < 0 then
    redis.call('ZREM', KEYS[1], member)
  else
    redis.call('ZADD', KEYS[1], ARGV[4], member)
  end
end
if ARGV[5] ~= '' then
  if tonumber(ARGV[5]) <= 0 and tonumber(ARGV[6]) <= 0 then
    redis.call('HDEL', KEYS[2], ARGV[1])
  else
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[5] .. ' ' .. ARGV[6])
  end
end
return 1
