-- lease_return.lua: give back `unspent` units of a lease (none of them was
-- or will be sent): src/limit/lease.rs (give_back), step for step. The
-- conformance tests hold the two together. Calendar helpers: lua/prelude.lua.
--
-- KEYS[1]  state hash: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  units given back
-- ARGV[4]  this instance's id ("" = none): its own count of a calendar
--          quota (<field>.m.<id>) goes down with the count
-- ARGV[5]  the lease's end (until): given back during it, the units leave
--          lu too (what clear.lua keeps counted)
-- ARGV[6]  number of limits B the lease booked, then four values each:
--            kind ("w", "day", "month"), field, end, step: what lease.lua
--            answered for it (a window's TAT after the lease and its T; a
--            calendar quota's period id and 0)
--
-- Returns 1 if anything was given back, 0 if not. A window gets its slots
-- back only while its TAT is still the lease's end (no admission followed);
-- a calendar quota its units, in the lease's period only. A missing key
-- stays missing.

local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return 0 end
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local unspent = tonumber(ARGV[3])
local inst = ARGV[4]
local untl = tonumber(ARGV[5])
local nb = tonumber(ARGV[6])
if unspent <= 0 then return 0 end
if now <= untl then
  local lu = tonumber(redis.call('HGET', key, 'lu') or '')
  if lu then
    lu = lu - unspent
    if lu < 0 then lu = 0 end
    redis.call('HSET', key, 'lu', fmt(lu))
  end
end

local writes = {}
local function put(f, x)
  writes[#writes + 1] = f
  writes[#writes + 1] = fmt(x)
end
for i = 7, 6 + 4 * nb, 4 do
  local kind, f, e, step = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if kind == 'w' then
    local tat = tonumber(redis.call('HGET', key, f) or '')
    if tat and tat == e and step > 0 then put(f, tat - unspent * step) end
  else
    local g = redis.call('HMGET', key, f .. '.p', f .. '.n', f .. '.q')
    local p = tonumber(g[1] or '')
    local current = period(kind, now, off)
    if p and e == current then
      local used, next = counts(p, tonumber(g[2] or '0') or 0, tonumber(g[3] or '0') or 0, current)
      if used > 0 then
        local left = used - unspent
        if left < 0 then left = 0 end
        put(f .. '.p', current)
        put(f .. '.n', left)
        put(f .. '.q', next)
        if inst ~= '' then
          local m = redis.call('HMGET', key, f .. '.m.' .. inst, f .. '.mp.' .. inst)
          local mine = tonumber(m[1] or '')
          if mine and tonumber(m[2] or '') == current then
            mine = mine - unspent
            if mine < 0 then mine = 0 end
            put(f .. '.m.' .. inst, mine)
          end
        end
      end
    end
  end
end
if #writes == 0 then return 0 end
redis.call('HSET', key, unpack(writes))
return 1
