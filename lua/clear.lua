-- clear.lua: WeChat reset an account's counters (clear_quota). Every state
-- hash given (all of one account: one Redis Cluster slot) starts the day
-- count of the current day again from 0 (calls reserved for the next day
-- stay reserved; the units of leases that may still be sent stay counted:
-- lu while le is ahead), and so does each caller's share of it (max_share: fields
-- day~<caller>.p/.n/.q); its penalty is lifted as set_penalty.lua lifts one.
-- Windows a frequency 45009 lowered are whole again; windows' TATs, month
-- counts, warm-up and slots are untouched. Mirrors
-- src/limit/decide.rs (clear).
--
-- KEYS     state hashes: <prefix>:{<account>}:<state>
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
  if redis.call('EXISTS', key) == 1 then
    found = found + 1
    local all = redis.call('HGETALL', key)
    -- Units of a lease that may still be sent stay counted (lua/lease.lua).
    local le, lu = 0, 0
    for i = 1, #all, 2 do
      if all[i] == 'le' then le = tonumber(all[i + 1]) or 0 elseif all[i] == 'lu' then lu = tonumber(all[i + 1]) or 0 end
    end
    local leased = 0
    if le > now then leased = lu end
    -- Each instance's own count of the day (lua/acquire.lua) starts again too.
    local own = {}
    for i = 1, #all, 2 do
      -- ... and so do windows a frequency 45009 lowered (lua/lower_windows.lua).
      if string.match(all[i], '^day%.mp?%.') or string.match(all[i], '^w%d+%.l[nktbau]$') then
        own[#own + 1] = all[i]
      end
    end
    if #own > 0 then redis.call('HDEL', key, unpack(own)) end
    for i = 1, #all, 2 do
      local day = string.match(all[i], '^(day)%.p$') or string.match(all[i], '^(day~[%w_%-]+)%.p$')
      if day then
        local p = tonumber(all[i + 1])
        if p == today then
          local kept = 0
          if day == 'day' then
            local n = 0
            for j = 1, #all, 2 do
              if all[j] == 'day.n' then n = tonumber(all[j + 1]) or 0 end
            end
            kept = math.min(n, leased)
          end
          redis.call('HSET', key, day .. '.n', fmt(kept))
        elseif p == today - 1 then
          redis.call('HSET', key, day .. '.p', fmt(today), day .. '.n', '0', day .. '.q', '0')
        end
      end
    end
    redis.call('HSET', key, 'pu', '0', 'ps', fmt(now), 'pl', '0', 'pn', '0')
  end
end
return found
