-- jobs_callbacks.lua: hands out one account's pending callbacks due by now
-- (JobStore::callbacks_due), oldest first, at most `room` of each caller (a
-- caller without room is passed over, so its backlog never hides another
-- caller's): each made due again after the lease and its times handed out
-- counted, so another instance takes it only after that.
--
-- KEYS[1]  B..'meta' (jobs_prelude.lua)
-- ARGV[1]  B     ARGV[2]  now (µs)     ARGV[3]  lease (µs)     ARGV[4]  most
-- ARGV[5]  each caller's room     ARGV[6..]  caller, its room, ... (others')
--
-- Returns {{the job's hash (HGETALL), ...}, earliest pending callback or -1}.

local now = tonumber(ARGV[2])
local again = now + tonumber(ARGV[3])
local most = tonumber(ARGV[4])
local each = tonumber(ARGV[5])
local room = {}
for i = 6, #ARGV - 1, 2 do
  room[ARGV[i]] = tonumber(ARGV[i + 1])
end
local out = {}
-- Read in pages by rank among the due: one handed out (due again after
-- the lease, past now) or dropped leaves the range, so the next page
-- starts that many ranks earlier.
local from = 0
while #out < most do
  local ids = redis.call('ZRANGEBYSCORE', B .. 'cbs', '-inf', ARGV[2], 'LIMIT', from, 256)
  if #ids == 0 then
    break
  end
  from = from + #ids
  for _, id in ipairs(ids) do
    if #out >= most then
      break
    end
    local k = jkey(id)
    local caller = redis.call('HGET', k, 'c')
    if not caller then
      redis.call('ZREM', B .. 'cbs', id)
      from = from - 1
    else
      local left = room[caller] or each
      if left > 0 then
        room[caller] = left - 1
        redis.call('HINCRBY', k, 'cbn', 1)
        redis.call('HSET', k, 'cbd', fmt(again))
        redis.call('ZADD', B .. 'cbs', again, id)
        from = from - 1
        out[#out + 1] = redis.call('HGETALL', k)
      end
    end
  end
end
return {out, callback_head()}
