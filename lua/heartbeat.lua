-- heartbeat.lua: the wxgate instances sharing this Redis, counted from
-- their heartbeats. Each instance calls it every few seconds with its id;
-- an instance not heard of for ARGV[3] microseconds is no longer counted.
-- What the count is for: the local fallback's share of each limit (a limit
-- divided by the instances that may decide it alone while Redis is away).
--
-- KEYS[1]  <prefix>:#instances (a sorted set: instance id -> last heard, µs)
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  this instance's id
-- ARGV[3]  how long a heartbeat counts, in microseconds
--
-- Returns the number of instances heard of within ARGV[3], this one included.

local now = store_now(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now - ttl))
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000) * 2)
return redis.call('ZCARD', KEYS[1])
