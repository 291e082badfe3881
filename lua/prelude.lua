-- prelude.lua: helpers shared by every script. wxgate prepends this file to
-- each script before loading it (Redis scripts cannot include one another),
-- so every script reads the clock, prints integers and does calendar
-- arithmetic the same way. The calendar functions are the ones in
-- src/limit/calendar.rs, step for step (Howard Hinnant's civil-date algorithms);
-- the conformance tests hold the two together.

local DAY = 86400000000
local MINUTE = 60000000

-- The store's clock: Redis TIME in microseconds, unless a test passed one.
local function store_now(given)
  if given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integer as a string without exponent (exact below 2^53). '%d' (a C
-- long in Redis's Lua 5.1) is several times cheaper than '%.0f', which goes
-- through glibc's multi-precision float printing; callers pass integers.
local function fmt(x)
  return string.format('%d', x)
end

-- Exact floor(x / y) for integers below 2^53 (a double division alone can
-- round up across an integer boundary).
local function idiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

-- (year, month 1-12) of a day number since 1970-01-01.
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- Days since 1970-01-01 of a proleptic Gregorian date.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- Period id and the start of the next period, for "day" or "month", of the
-- period containing `now` at UTC offset `off` (Period::id, Period::next_start).
local function period(kind, now, off)
  local day = idiv(now + off, DAY)
  if kind == 'day' then
    return day, (day + 1) * DAY - off
  end
  local y, m = civil_from_days(day)
  local ny, nm = y, m + 1
  if m == 12 then ny, nm = y + 1, 1 end
  return y * 12 + (m - 1), days_from_civil(ny, nm, 1) * DAY - off
end

-- The local midnight that starts the next day after `now` (next_midnight).
local function next_midnight(now, off)
  local _, nxt = period('day', now, off)
  return nxt
end

-- The next whole local minute after `now`, strictly later (next_minute).
local function next_minute(now, off)
  return (idiv(now + off, MINUTE) + 1) * MINUTE - off
end


-- Calls counted in period `current` and reserved for `current + 1`, from a
-- calendar quota's stored period p, count n and reservations q (counts).
local function counts(p, n, q, current)
  if p == current then return n, q end
  if p == current - 1 then return q, 0 end
  return 0, 0
end

-- A pair's state (<prefix>:{<account>}:<rule>, and a recipient's windows):
-- one string value, a MessagePack map of field -> number (cmsgpack, built
-- into Redis's Lua). One GET and one SET per script run, no field names
-- sent or decimal numbers parsed or printed. Fields as documented in
-- lua/acquire.lua. A key still holding the hash of decimal fields an older
-- wxgate wrote is read as that hash; writing it back packs it (the
-- migration: every key is converted the first time a script writes it).
-- Returns the table (empty for a missing key) and whether the key exists.
-- A key of another type, or a string that is not a map, fails the script
-- with WRONGTYPE (the store treats it as that pair's bad key).
local function state_read(key)
  local s = redis.pcall('GET', key)
  if type(s) == 'table' then
    if not s.err or not string.find(s.err, 'WRONGTYPE', 1, true) then
      return error(s)
    end
    local all = redis.call('HGETALL', key)
    local t = {}
    for i = 1, #all, 2 do
      local x = tonumber(all[i + 1])
      if x then t[all[i]] = x end
    end
    return t, true
  end
  if not s then return {}, false end
  local ok, t = pcall(cmsgpack.unpack, s)
  if not ok or type(t) ~= 'table' then
    return error('WRONGTYPE ' .. key .. ' holds no wxgate pair state')
  end
  return t, true
end

-- Writes `t` (field -> number, every value a number) as `key`'s state,
-- keeping the key's TTL (a new key gets none: callers set it), or setting
-- it to `px` ms when given (one command instead of SET and PEXPIRE).
local function state_put(key, t, px)
  if px then
    redis.call('SET', key, cmsgpack.pack(t), 'PX', px)
  else
    redis.call('SET', key, cmsgpack.pack(t), 'KEEPTTL')
  end
end

-- state_put for a table whose fields may also be false (absent).
local function state_write(key, t, px)
  local clean = {}
  for f, x in pairs(t) do
    if x then clean[f] = x end
  end
  state_put(key, clean, px)
end
