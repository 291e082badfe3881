-- jobs_summary.lua: one account's queues' counts by state and oldest
-- unfinished job (JobStore::summary). Read only.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  only this caller's queues, or '' for every caller's
--
-- Returns {{caller, rule, state, count, ...}, {caller, rule, oldest submission (µs), ...}}.

local only = ARGV[2]
local counts = {}
local c = redis.call('HGETALL', B .. 'counts')
for i = 1, #c, 2 do
  local caller, rule, state = string.match(c[i], '^(.-)\n(.-)\n(.*)$')
  if only == '' or caller == only then
    counts[#counts + 1] = caller
    counts[#counts + 1] = rule
    counts[#counts + 1] = state
    counts[#counts + 1] = tonumber(c[i + 1])
  end
end
local oldest = {}
for _, q in ipairs(redis.call('SMEMBERS', B .. 'qs')) do
  local caller, rule = string.match(q, '^(.-)\n(.*)$')
  if only == '' or caller == only then
    local h = redis.call('ZRANGE', qkey(caller, rule), 0, 0)
    if #h > 0 then
      oldest[#oldest + 1] = caller
      oldest[#oldest + 1] = rule
      oldest[#oldest + 1] = tonumber(redis.call('HGET', jkey(h[1]), 'sub'))
    end
  end
end
return {counts, oldest}
