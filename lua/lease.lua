-- lease.lua: take a lease of up to `want` units of a pair's limits,
-- spendable for at most `span` from now: src/limit/lease.rs (take), step
-- for step, with the argument of why a leased unit keeps every window
-- exact. The conformance tests hold the two together. Calendar helpers:
-- lua/prelude.lua.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- KEYS[2]  (single server, once the epoch is read) <prefix>:#epoch, and the
--          epoch this instance knows as the last ARGV: another there answers
--          "E" and grants nothing (as acquire.lua's ARGV[3])
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  units wanted (0: none; the caller passes 0 for a rule leases do
--          not support: a concurrency cap, max_share, per_recipient, warm-up)
-- ARGV[4]  the lease's longest span, µs; -1: a reserve (the calendar quotas
--          only, until their period's end; no window booked, le and lc
--          untouched: src/limit/lease.rs "Reserves")
-- ARGV[5]  the lease's record: this instance's id ("" = none), and "#r"
--          after it for a reserve. The instance's own count of each
--          calendar quota (<field>.m.<id>, lua/acquire.lua) goes up with the
--          lease, which becomes the record's last lease of the pair
--          (le.<record>, lu.<record>)
-- ARGV[6]  number of limits L, then the rule's limits, five values each, as
--          acquire.lua takes them: kind, field, a, b, r ("w"/"wl": T, τ;
--          "day"/"month": count, learn-both; r: what a normal caller leaves)
--
-- Returns "0" (nothing granted), or "k at until esc qi qr qt e1 … eL": k
-- units sent between `at` (now) and `until`; esc 1 when a success should end
-- a penalty's escalation (as acquire.lua's); qi qr qt the limit with least
-- room left after the lease, as acquire.lua's; per limit what it booked: a window's
-- TAT after the lease, a calendar quota's period id. Writes the limits, lc,
-- le (the latest lease end, which refund.lua honours), the instance's last
-- lease (le.<id> its end, lu.<id> its units: clear.lua keeps them counted
-- while it lasts) and the key's TTL.

local key = KEYS[1]
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local span = tonumber(ARGV[4])
local reserve = span < 0
local rec = ARGV[5]
local inst = string.match(rec, '^[^#]*')
local nl = tonumber(ARGV[6])
-- Checked as acquire.lua checks it: Redis lost its data, re-seed first.
if #KEYS > 1 and redis.call('GET', KEYS[2]) ~= ARGV[7 + 5 * nl] then return 'E' end
if want <= 0 or nl == 0 then return '0' end
-- src/limit/learned.rs KEEP_US, as acquire.lua's KEEP_LEARNED.
local KEEP_LEARNED = 172800000000

local limits = {}
for i = 7, 6 + 5 * nl, 5 do
  local l = {kind = ARGV[i], f = ARGV[i + 1], a = tonumber(ARGV[i + 2]), b = tonumber(ARGV[i + 3]), r = tonumber(ARGV[i + 4])}
  if l.kind == 'wl' then l.kind, l.learn = 'w', true end
  limits[#limits + 1] = l
end
local v = state_read(key)

-- A penalty grants nothing.
if (v.pu or 0) > now then return '0' end

-- The lease ends with its span and with the current period of every calendar quota.
local untl = now + span
if reserve then untl = 1e18 end
for _, l in ipairs(limits) do
  if l.kind ~= 'w' then
    local _, nxt = period(l.kind, now, off)
    if nxt - 1 < untl then untl = nxt - 1 end
  end
end
-- A reserve of a rule without a calendar quota holds nothing.
if untl >= 1e18 then return '0' end

-- How many units every limit holds.
local units = want
for _, l in ipairs(limits) do
  local room
  if l.kind == 'w' and reserve then
    room = units
  elseif l.kind == 'w' then
    if l.learn then
      local lu = v[l.f .. '.lu']
      if lu and lu > now then
        local lt, lb = v[l.f .. '.lt'], v[l.f .. '.lb']
        if lt and lt > l.a then l.a = lt end
        if lb and lb < l.b then l.b = lb end
      end
    end
    local tat = v[l.f]
    if tat == nil or tat < now then tat = now end
    if tat < untl then tat = untl end
    l.v0 = tat
    local free = now + l.b - l.r - tat
    if free < 0 then room = 0 else room = idiv(free, l.a) + 1 end
  else
    local count = l.a
    if l.kind == 'day' then
      local learned, la = v[l.f .. '.l'], v[l.f .. '.la']
      if learned and la and now < la + KEEP_LEARNED and (l.b == 1 or learned < l.a) then count = learned end
    end
    l.id = period(l.kind, now, off)
    l.used, l.next = counts(v[l.f .. '.p'] or -1e18, v[l.f .. '.n'] or 0, v[l.f .. '.q'] or 0, l.id)
    l.count = count
    room = count - l.r - l.used
    if room < 0 then room = 0 end
    -- At most half of what is left, rounded up.
    room = idiv(room + 1, 2)
  end
  if room < units then units = room end
end
if units <= 0 then return '0' end

-- Book them: each window's slots from max(tat, until), each calendar's count.
-- A success of a leased call ends a penalty's escalation (acquire.lua's).
local escalated = 0
if (v.pn or 0) > 0 and now < (v.pu or 0) + v.pn then escalated = 1 end
local writes, ends, ttl = {}, {}, 0
-- The limit with least room left after the lease (1-based; acquire.lua's qi qr qt).
local qi, qr, qt = 0, 0, 0
local function tightest(i, room, reset)
  if qi == 0 or room < qr then qi, qr, qt = i, room, reset end
end
local function put(f, x)
  writes[f] = x
end
local mine = v
for i, l in ipairs(limits) do
  if l.kind == 'w' and reserve then
    ends[#ends + 1] = '0'
  elseif l.kind == 'w' then
    if l.learn and (v[l.f] == nil or v[l.f] < now) then put(l.f .. '.r', now) end
    local e = l.v0 + units * l.a
    put(l.f, e)
    ends[#ends + 1] = fmt(e)
    if e - now > ttl then ttl = e - now end
    local room = idiv(now + l.b + l.a - e, l.a)
    if room < 0 then room = 0 end
    tightest(i, room, e - now)
  else
    put(l.f .. '.p', l.id)
    put(l.f .. '.n', l.used + units)
    put(l.f .. '.q', l.next)
    ends[#ends + 1] = fmt(l.id)
    local left = l.count - l.used - units
    if left < 0 then left = 0 end
    local _, nxt = period(l.kind, now, off)
    tightest(i, left, nxt - now)
    if inst ~= '' then
      local mf, pf = l.f .. '.m.' .. inst, l.f .. '.mp.' .. inst
      local m = 0
      if mine[pf] == l.id then m = mine[mf] or 0 end
      put(pf, l.id)
      put(mf, m + units)
    end
    local _, nxt = period(l.kind, now, off)
    local keep = nxt
    if l.next > 0 then
      local _, after = period(l.kind, nxt, off)
      keep = after
    end
    if keep - now > ttl then ttl = keep - now end
  end
end
if not reserve then put('lc', now) end
-- The instance's last lease: this one replaces it (the instance takes its
-- next lease only once the last is spent or over, so only this one may
-- still send: what clear.lua keeps); the records of leases over go.
for f, x in pairs(v) do
  local who = string.match(f, '^le%.(.*)$')
  if who and x <= now then
    put(f, false)
    put('lu.' .. who, false)
  end
end
put('le.' .. rec, untl)
put('lu.' .. rec, units)
if not reserve then
  local le = v.le or 0
  if untl > le then le = untl end
  put('le', le)
end
-- The key's TTL, as acquire.lua keeps it (never shortened).
local ms = math.floor(ttl / 1000) + 1000
local lives = -1
if v.ex then lives = v.ex - now else lives = redis.call('PTTL', key) * 1000 end
local extend
if lives < ms * 1000 then
  extend = ms + 10000
  put('ex', now + extend * 1000)
end
for f, x in pairs(writes) do v[f] = x end
state_write(key, v)
if extend then redis.call('PEXPIRE', key, extend) end
return string.format('%d %d %d %d %d %d %d ', units, now, untl, escalated, qi, qr, qt) .. table.concat(ends, ' ')
