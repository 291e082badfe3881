-- lease_return.lua: give back `unspent` units of a lease (none of them was
-- or will be sent): src/limit/lease.rs (give_back), step for step. The
-- conformance tests hold the two together. Calendar helpers: lua/prelude.lua.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  units given back
-- ARGV[4]  the lease's record (lease.lua's ARGV[5]): this instance's id
--          ("" = none), "#r" after it for a reserve; the instance's own
--          count of a calendar quota (<field>.m.<id>) goes down with the count
-- ARGV[5]  the lease's end (until), which names it: while it is the
--          instance's last (le.<id>), the units leave lu.<id> too (what
--          clear.lua keeps counted)
-- ARGV[6]  when the lease was taken (at): taken before the last clear (cl),
--          it gives back of the day count only what the clear kept of it
--          (lu.<id>, while it was the instance's last): the rest is gone
-- ARGV[7]  number of limits B the lease booked, then four values each:
--            kind ("w", "day", "month"), field, end, step: what lease.lua
--            answered for it (a window's TAT after the lease and its T; a
--            calendar quota's period id and 0)
--
-- Returns 1 if anything was given back, 0 if not. A window gets its slots
-- back only while its TAT is still the lease's end (no admission followed);
-- a calendar quota its units, in the lease's period only. A missing key
-- stays missing.

local key = KEYS[1]
local st, exists = state_read(key)
if not exists then return 0 end
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local unspent = tonumber(ARGV[3])
local rec = ARGV[4]
local inst = string.match(rec, '^[^#]*')
local untl = tonumber(ARGV[5])
local at = tonumber(ARGV[6])
local nb = tonumber(ARGV[7])
if unspent <= 0 then return 0 end
local dirty = false
-- The instance's record of the lease, while it is still its last.
local lf = 'lu.' .. rec
local lu
if st['le.' .. rec] == untl then lu = st[lf] end
-- A clear since the take left of the lease in the day count only what it
-- kept of the record: no more of the day comes back.
local day = unspent
if (st.cl or 0) >= at then
  day = 0
  if lu then day = math.min(lu, unspent) end
end
if lu then
  lu = lu - unspent
  if lu < 0 then lu = 0 end
  st[lf] = lu
  dirty = true
end

local gave = false
for i = 8, 7 + 4 * nb, 4 do
  local kind, f, e, step = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local back = unspent
  if kind == 'day' then back = day end
  if kind == 'w' then
    local tat = st[f]
    if tat and tat == e and step > 0 then
      st[f] = tat - unspent * step
      gave = true
    end
  else
    local p = st[f .. '.p']
    local current = period(kind, now, off)
    if p and e == current and back > 0 then
      local used, next = counts(p, st[f .. '.n'] or 0, st[f .. '.q'] or 0, current)
      if used > 0 then
        local left = used - back
        if left < 0 then left = 0 end
        st[f .. '.p'], st[f .. '.n'], st[f .. '.q'] = current, left, next
        gave = true
        if inst ~= '' then
          local mf = f .. '.m.' .. inst
          local mine = st[mf]
          if mine and st[f .. '.mp.' .. inst] == current then
            mine = mine - back
            if mine < 0 then mine = 0 end
            st[mf] = mine
          end
        end
      end
    end
  end
end
if gave or dirty then state_write(key, st) end
if gave then return 1 end
return 0
