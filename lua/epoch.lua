-- epoch.lua: the deployment's epoch, a value written once into an empty
-- Redis and never changed or expired. An instance remembers the epoch it
-- started under; another value later means Redis lost wxgate's data
-- (restart without persistence, failover to an empty replica, FLUSHALL) and
-- the instance re-seeds what it knows (src/store/ledger.rs).
--
-- KEYS[1]  <prefix>:#epoch
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  a random value, used if there is no epoch yet
--
-- Returns {epoch, created, now}: the epoch ("<created µs>:<random>"), when
-- it was written, and the store's now.

local now = store_now(ARGV[1])
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = fmt(now) .. ':' .. ARGV[2]
  redis.call('SET', KEYS[1], epoch)
end
local created = tonumber(string.match(epoch, '^(%d+):')) or 0
return {epoch, created, now}
