-- penalties.lua: the pairs the index of penalties (lua/penalty_index.lua)
-- notes as penalised beyond now, those ending last first. Read only. An
-- entry may name a pair whose penalty was lifted since (a clear_quota,
-- raced by a new penalty): the caller reads each pair it lists.
--
-- KEYS[1]  the index: <prefix>:#penalties
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  most entries to return
--
-- Returns {{"<account>:<rule state>", until}, ...}.

local now = store_now(ARGV[1])
local found = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. fmt(now), 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for i = 1, #found, 2 do
  out[#out + 1] = {found[i], tonumber(found[i + 1])}
end
return out
