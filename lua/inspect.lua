-- inspect.lua: read one (account, rule)'s whole state at once, for the admin
-- API (GET /v1/buckets). Read-only.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- KEYS[2]  concurrency slots: <prefix>:{<account>}:<rule>:c
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
--
-- Returns {now, {field, value, ...}, {holder, expiry, ...}}.

local now = store_now(ARGV[1])
local fields = {}
for f, x in pairs(state_read(KEYS[1])) do
  fields[#fields + 1] = f
  fields[#fields + 1] = fmt(x)
end
return {now, fields, redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
