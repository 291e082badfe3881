-- warm.lua: an access-token refresh passed through for an account; warm-up
-- starts again for its rules (acquire.lua reads this key).
--
-- KEYS[1]  <prefix>:{<account>}:#warm
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  how long to keep it, ms (the longest warm-up of any rule)
--
-- Returns the time written.

local now = store_now(ARGV[1])
redis.call('SET', KEYS[1], fmt(now), 'PX', ARGV[2])
return now
