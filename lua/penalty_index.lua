-- penalty_index.lua: notes a pair's penalty in the index of penalties, a
-- sorted set of "<account>:<rule state>" scored by when the penalty ends,
-- which lists the penalties in force without reading every pair
-- (lua/penalties.lua; the admin API's GET /v1/penalties). Run after
-- penalise.lua, set_penalty.lua and reconcile.lua with what they answered,
-- as a command of its own: in a Cluster the index lives in another slot
-- than the pair. src/store/redis/penalties.rs.
--
-- KEYS[1]  the index: <prefix>:#penalties
-- ARGV[1]  the store's now, as the pair's script answered it (microseconds)
-- ARGV[2]  the pair: <account>:<rule state> (an account has no ':')
-- ARGV[3]  when its penalty ends (microseconds); 0 or past: none
-- ARGV[4]  "raise": keep a later end already noted (a penalty WeChat's
--          errcodes start only lengthens; two instances may note theirs in
--          either order); "set": this end, or none (a penalty set or lifted
--          by hand)
--
-- Drops the entries whose penalty ended. Returns 1.

local key, now, member, untl, mode = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
if untl > now then
  local noted = tonumber(redis.call('ZSCORE', key, member) or '0')
  if mode == 'set' or untl > noted then
    redis.call('ZADD', key, ARGV[3], member)
  end
elseif mode == 'set' then
  redis.call('ZREM', key, member)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
return 1
