-- token_owner.lua: the account an access token (by its keyed hash) was
-- issued to, while the mapping lasts (learn_token.lua writes it).
--
-- KEYS[1]  <prefix>:#token:<hash>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
--
-- Returns {account, until, now}; account "" when the token is unknown or
-- its mapping is over (the key's TTL runs on Redis's clock, until on the
-- store's: both say the same outside tests).

local now = store_now(ARGV[1])
local v = redis.call('GET', KEYS[1])
if v then
  local untl, account = string.match(v, '^(%d+):(.+)$')
  untl = tonumber(untl)
  if untl and untl > now then
    return {account, untl, now}
  end
end
return {'', 0, now}
