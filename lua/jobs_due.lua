-- jobs_due.lua: the due queues per caller (JobStore::due_queues), from the
-- index jobs_note.lua keeps: every caller whose oldest indexed head is due,
-- in that order (ties by name), and at most N of its queues whose head is
-- due, oldest head first (ties by account, then rule). Reads only. The
-- index may be stale (src/store/jobs/redis.rs): claim checks the queue.
--
-- KEYS[1]  <prefix>:{#jobs}:due-callers   zset caller -> its oldest head
-- ARGV[1]  <prefix>:{#jobs}:due:          what each caller's zset's key
--          starts with (the caller's name follows; same slot as KEYS[1])
-- ARGV[2]  now (µs)     ARGV[3]  N, most queues per caller (>= 1)
--
-- Returns {caller, account\nrule, ...}. Work: O(C log C) for the callers
-- with due work, then O(log M + N) per caller for M indexed queues.

local now, n = ARGV[2], tonumber(ARGV[3])
local out = {}
for _, caller in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  for _, q in ipairs(redis.call('ZRANGEBYSCORE', ARGV[1] .. caller, '-inf', now, 'LIMIT', 0, n)) do
    out[#out + 1] = caller
    out[#out + 1] = q
  end
end
return out
