-- clear.lua: WeChat reset an account's counters (clear_quota). Every state
-- hash given (all of one account: one Redis Cluster slot) starts the day
-- count of the current day again from 0 (calls reserved for the next day
-- stay reserved; the units of leases that may still be sent stay counted:
-- each instance's last lease, lu.<id> while le.<id> is ahead, lua/lease.lua),
-- and so does each caller's share of it (max_share: fields
-- day~<caller>.p/.n/.q); its penalty is lifted as set_penalty.lua lifts one,
-- and cl notes when (a lease taken before gives back of the day only what
-- was kept of it: lua/lease_return.lua).
-- Windows a frequency 45009 lowered are whole again; windows' TATs, month
-- counts, warm-up and slots are untouched. Mirrors
-- src/limit/decide.rs (clear).
--
-- KEYS     pair states: <prefix>:{<account>}:<state>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
--
-- Returns how many of the states existed. A state that does not exist is
-- left absent (nothing to clear).

local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local today = period('day', now, off)
local found = 0
for _, key in ipairs(KEYS) do
  local st, exists = state_read(key)
  if exists then
    found = found + 1
    -- Units of a lease that may still be sent stay counted: each
    -- instance may still send from its last lease only, while it lasts
    -- (lua/lease.lua).
    local leased = 0
    local own, days = {}, {}
    for f, x in pairs(st) do
      local who = string.match(f, '^le%.(.*)$')
      if who and x > now then leased = leased + (st['lu.' .. who] or 0) end
      -- Each instance's own count of the day (lua/acquire.lua) starts again
      -- too, and so do windows a frequency 45009 lowered (lua/lower_windows.lua).
      if string.match(f, '^day%.mp?%.') or string.match(f, '^w%d+%.l[nktbauh]$') then
        own[#own + 1] = f
      end
      local day = string.match(f, '^(day)%.p$') or string.match(f, '^(day~[%w_%-]+)%.p$')
      if day then days[#days + 1] = {day, x} end
    end
    for _, f in ipairs(own) do st[f] = nil end
    for _, d in ipairs(days) do
      local day, p = d[1], d[2]
      if p == today then
        local kept = 0
        if day == 'day' then kept = math.min(st['day.n'] or 0, leased) end
        st[day .. '.n'] = kept
      elseif p == today - 1 then
        st[day .. '.p'], st[day .. '.n'], st[day .. '.q'] = today, 0, 0
      end
    end
    st.pu, st.ps, st.pl, st.pn = 0, now, 0, 0
    st.cl = now
    state_write(key, st)
  end
end
return found
