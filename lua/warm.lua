-- warm.lua: an access-token refresh passed through for an account; warm-up
-- starts again for its rules (acquire.lua reads this key).
--
-- KEYS[1]  <prefix>:{<account>}:#warm
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  how long to keep it, ms (the longest warm-up of any rule)
--
-- Returns the time written.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
redis.call('SET', KEYS[1], string.format('%.0f', now), 'PX', ARGV[2])
return now
