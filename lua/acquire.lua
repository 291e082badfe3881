-- acquire.lua: decide one call of an (account, rule), atomically.
-- The same decision as src/limit.rs (decide), line for line; the conformance
-- tests run one scenario table against both.
--
-- KEYS[1]  state hash: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (production always
--          passes ""; only tests pass a time, for determinism)
-- ARGV[2]  quota_timezone offset from UTC, microseconds
-- ARGV[3..] the rule's limits, four values each: kind, field, a, b
--          kind "w"   window limit: a = emission interval T, b = tolerance τ (µs)
--          kind "day" | "month"  calendar quota: a = count, b = 0
--
-- Returns {1, now, escalated}   admitted (escalated: 1 when a penalty is recent)
--         {0, wait_us, reason}  refused; reason 1 rate, 2 quota, 3 penalty
--
-- Hash fields: <field> = GCRA theoretical arrival time (window limits);
-- <field>.p / <field>.n = period id / calls counted (calendar quotas);
-- pu, ps, pl, pn = penalty until, started, level, last length.
-- A refusal writes nothing. An admission writes every limit and sets the
-- key's TTL to the longest time any of its state still matters.

local DAY = 86400000000

local function num(s, default)
  if s == nil or s == false then return default end
  return tonumber(s) or default
end

local function fmt(x)
  return string.format('%.0f', x)
end

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

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- Period id and the start of the next period, for "day" or "month".
local function period(kind, now, off)
  local day = math.floor((now + off) / DAY)
  if kind == 'day' then
    return day, (day + 1) * DAY - off
  end
  local y, m = civil_from_days(day)
  local ny, nm = y, m + 1
  if m == 12 then ny, nm = y + 1, 1 end
  return y * 12 + (m - 1), days_from_civil(ny, nm, 1) * DAY - off
end

local key = KEYS[1]
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local off = tonumber(ARGV[2])

local fields = {'pu', 'pn'}
for i = 3, #ARGV, 4 do
  local f = ARGV[i + 1]
  if ARGV[i] == 'w' then
    fields[#fields + 1] = f
  else
    fields[#fields + 1] = f .. '.p'
    fields[#fields + 1] = f .. '.n'
  end
end
local vals = redis.call('HMGET', key, unpack(fields))

local pu, pn = num(vals[1], 0), num(vals[2], 0)
if pu > now then
  return {0, pu - now, 3}
end

local worst, reason = 0, 0
local writes = {}
local ttl = 0
local v = 3
for i = 3, #ARGV, 4 do
  local kind, f, a, b = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if kind == 'w' then
    local tat = num(vals[v], 0)
    v = v + 1
    if tat < now then tat = now end
    local wait = tat - b - now
    if wait > worst then worst, reason = wait, 1 end
    writes[#writes + 1] = f
    writes[#writes + 1] = fmt(tat + a)
    if tat + a - now > ttl then ttl = tat + a - now end
  else
    local id, nxt = period(kind, now, off)
    local used = 0
    if num(vals[v], -1) == id then used = num(vals[v + 1], 0) end
    v = v + 2
    if used >= a then
      local wait = nxt - now
      if wait > worst then worst, reason = wait, 2 end
    end
    writes[#writes + 1] = f .. '.p'
    writes[#writes + 1] = fmt(id)
    writes[#writes + 1] = f .. '.n'
    writes[#writes + 1] = fmt(used + 1)
    if nxt - now > ttl then ttl = nxt - now end
  end
end
if worst > 0 then
  return {0, worst, reason}
end

local escalated = 0
if pn > 0 and now < pu + pn then escalated = 1 end
if #writes > 0 then
  redis.call('HSET', key, unpack(writes))
  if pu + pn - now > ttl then ttl = pu + pn - now end
  -- Never shorten a TTL another rule version or a penalty set.
  local ms = math.floor(ttl / 1000) + 1000
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
return {1, now, escalated}
