-- epoch.lua: the deployment's epoch, a value written into an empty Redis
-- and never expired. An instance remembers the epoch it decides under;
-- another value later means Redis lost wxgate's data, or some of it (restart
-- without persistence, failover to an empty replica or to one that missed
-- the last writes, FLUSHALL), and the instance tops up what it knows
-- (src/store/ledger.rs, lua/reconcile.lua).
--
-- The epoch follows the Redis server process too: with KEYS[2], the run_id
-- of the server it was last read on is kept there, and a server with
-- another run_id (a replica promoted by Sentinel or a DNS failover, or a
-- restart, which may have lost the last second of an AOF) writes a new
-- epoch. A key written by an older wxgate (no KEYS[2] value yet) is adopted
-- as it is. A server that refuses INFO in a script (some managed proxies)
-- leaves the epoch as without KEYS[2].
--
-- KEYS[1]  <prefix>:#epoch
-- KEYS[2]  optional: <prefix>:#epoch-run (not in a Cluster: its own slot)
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  a random value, used if there is no epoch yet or it rotates
--
-- Returns {epoch, created, now}: the epoch ("<created µs>:<random>", with
-- ":run" when it rotated for a new server process over data it kept), when
-- it was written, and the store's now.

local now = store_now(ARGV[1])
local epoch = redis.call('GET', KEYS[1])
if KEYS[2] then
  local info = redis.pcall('INFO', 'server')
  local run = type(info) == 'string' and string.match(info, 'run_id:(%x+)')
  if run then
    local known = redis.call('GET', KEYS[2])
    if epoch and known and known ~= run then
      -- The data is there (all of it or nearly): ":run" tells the
      -- instances that nothing is empty (src/store/resilient.rs: no grace).
      epoch = fmt(now) .. ':' .. ARGV[2] .. ':run'
      redis.call('SET', KEYS[1], epoch)
    end
    if known ~= run then redis.call('SET', KEYS[2], run) end
  end
end
if not epoch then
  epoch = fmt(now) .. ':' .. ARGV[2]
  redis.call('SET', KEYS[1], epoch)
end
local created = tonumber(string.match(epoch, '^(%d+):')) or 0
return {epoch, created, now}
