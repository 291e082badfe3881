-- learn_token.lua: an access token's answer passed through; the token (by
-- its keyed hash, never in clear: src/store/tokens.rs) belongs to an
-- account until it expires. The key expires with it.
--
-- KEYS[1]  <prefix>:#token:<hash>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  the account
-- ARGV[3]  the token's lifetime (expires_in), microseconds
--
-- Stores "<until µs>:<account>"; returns until.

local now = store_now(ARGV[1])
local ttl = tonumber(ARGV[3])
local untl = now + ttl
redis.call('SET', KEYS[1], fmt(untl) .. ':' .. ARGV[2], 'PX', fmt(idiv(ttl + 999, 1000)))
return untl
