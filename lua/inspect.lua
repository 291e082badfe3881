-- inspect.lua: read one (account, rule)'s whole state at once, for the admin
-- API (GET /v1/buckets). Read-only.
--
-- KEYS[1]  state hash: <prefix>:{<account>}:<rule>
-- KEYS[2]  concurrency slots: <prefix>:{<account>}:<rule>:c
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
--
-- Returns {now, {field, value, ...}, {holder, expiry, ...}}.

local now = store_now(ARGV[1])
return {now, redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
