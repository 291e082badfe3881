-- refund.lua: a call admitted at `at` never reached WeChat; give back what
-- its admission took, never more. The same logic as src/limit/decide.rs
-- (refund), step for step; the conformance tests hold the two together.
-- Calendar helpers: lua/prelude.lua.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  when the call was admitted for (store time, from acquire.lua)
-- ARGV[4]  the rule's max_wait, µs
-- ARGV[5]  number of limits L, then the rule's limits, four values each, as
--          acquire.lua takes them: kind, field, a, b
--            kind "w"   window limit: a = emission interval T, b = tolerance τ (µs)
--            kind "day" | "month"  calendar quota: a = count, b = 0
-- then     the call's cost n (each of its n units given back as below),
--          then this instance's id ("" = none): its own count of a calendar
--          quota (<field>.m.<id>, lua/acquire.lua) goes down with the count
--
-- Returns 1 if anything was given back, 0 if not.
--
-- A window limit's TAT moves back by T - (p - at), clamped to [0, T], where
-- p = max(now, lc + max_wait, le) bounds the forward time of every call
-- admitted so far (le: the latest lease's end, until which a leased unit may
-- be sent: lua/lease.lua) (n T and [0, n T] for a call costing n). A
-- calendar quota's count for the period of `at` goes down by one (n)
-- (.n if that period is the current one, .q if the call was reserved for the
-- next), never below 0; a period already over gives nothing back. Nothing
-- else changes (penalty, warm-up, slots), and a missing key stays missing:
-- the key's TTL already covers the larger state it held.

local key = KEYS[1]
local st, exists = state_read(key)
if not exists then return 0 end
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local at = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local last = 5 + 4 * tonumber(ARGV[5])
local cost = tonumber(ARGV[last + 1]) or 1
local inst = ARGV[last + 2] or ''


local lc, le = st.lc or 0, st.le or 0
local pinned = now
if lc + max_wait > pinned then pinned = lc + max_wait end
if le > pinned then pinned = le end

local changed_any = false
for i = 6, last, 4 do
  local kind, f, a = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if kind == 'w' then
    local took = cost * a
    local back = at + took - pinned
    if back > took then back = took end
    if back > 0 then
      local tat = st[f]
      if tat then
        st[f] = tat - back
        changed_any = true
      end
    end
  else
    local p = st[f .. '.p']
    if p then
      local current = period(kind, now, off)
      local used, next = counts(p, st[f .. '.n'] or 0, st[f .. '.q'] or 0, current)
      local of_call = period(kind, at, off)
      local changed = false
      if of_call == current and used > 0 then
        used = used - cost
        if used < 0 then used = 0 end
        changed = true
        if inst ~= '' then
          local mf = f .. '.m.' .. inst
          local mine = st[mf]
          if mine and st[f .. '.mp.' .. inst] == current then
            mine = mine - cost
            if mine < 0 then mine = 0 end
            st[mf] = mine
          end
        end
      elseif of_call == current + 1 and next > 0 then
        next = next - cost
        if next < 0 then next = 0 end
        changed = true
      end
      if changed then
        st[f .. '.p'], st[f .. '.n'], st[f .. '.q'] = current, used, next
        changed_any = true
      end
    end
  end
end
if not changed_any then return 0 end
state_write(key, st)
return 1
