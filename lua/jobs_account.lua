-- jobs_account.lua: before a submission, the account's number in job ids
-- and the caller's unfinished jobs and bytes in its other accounts
-- (queued delivery, src/store/jobs/redis.rs). A job id is the account's
-- number (4 bytes) and 12 random bytes, so an id names its account's keys.
-- Numbers are given once and never change; the hash of accounts is also
-- the list that recover, summary and purge go through, written here before
-- the account's first job is.
--
-- KEYS[1]  <prefix>:{#jobs}:accounts      hash account -> number
-- KEYS[2]  <prefix>:{#jobs}:names         hash number -> account
-- KEYS[3]  <prefix>:{#jobs}:next          the last number given
-- KEYS[4]  <prefix>:{#jobs}:caller:<caller>  hash account -> "<jobs> <bytes>"
--          (jobs_note.lua)
-- ARGV[1]  the account
--
-- Returns {the account's number, the caller's jobs elsewhere, its bytes elsewhere}.

local n = redis.call('HGET', KEYS[1], ARGV[1])
if not n then
  n = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[1], ARGV[1], n)
end
redis.call('HSET', KEYS[2], n, ARGV[1])
local jobs, bytes = 0, 0
local t = redis.call('HGETALL', KEYS[4])
for i = 1, #t, 2 do
  if t[i] ~= ARGV[1] then
    local j, b = string.match(t[i + 1], '^(%d+) (%d+)$')
    jobs = jobs + (tonumber(j) or 0)
    bytes = bytes + (tonumber(b) or 0)
  end
end
return {tonumber(n), jobs, bytes}
