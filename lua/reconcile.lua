-- reconcile.lua: add to an (account, rule)'s shared state what one instance
-- knows and Redis does not: calls it admitted while Redis was away (the
-- local fallback), or everything it admitted today when Redis lost its data;
-- and a penalty it knows that Redis has lost. Each instance adds only its
-- own calls, so instances re-seeding at once restore the sum without
-- counting a call twice (src/store/ledger.rs).
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<rule>
-- KEYS[2]  optional: <prefix>:#epoch; then the last ARGV is the epoch the
--          instance knows, and nothing is written if Redis holds another
--          (it lost its data since: the instance re-seeds everything
--          instead, and a count added now would be added twice)
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3..6]  penalty: until, started, level, last length (until 0: none);
--             written if it ends later than the stored one
-- ARGV[7]  this instance's id ("" = none): its own count of each quota's
--          current period is in <field>.m.<id> (period <field>.mp.<id>), as
--          acquire.lua keeps it
-- ARGV[8]  number of counts C, then per count five values:
--            kind ("day" | "month"), field, period id, calls, mode
--          mode "a" (add): a count for the current period is added to its
--          calls (and to this instance's own count), one for the next period
--          to its reservations; one for a period already over is dropped.
--          mode "t" (top-up, after Redis lost data or a failover to a
--          replica that missed the last writes): `calls` is everything this
--          instance admitted in the current period; only what Redis does not
--          already count as this instance's (calls - its own count) is
--          added, and its own count becomes `calls`: sent twice, or by every
--          instance at once, nothing is counted twice, and nothing this
--          instance admitted is missing after it. A top-up for the next
--          period adds (reservations are not counted per instance).
--
-- Returns now, or -1 if the epoch differs. Hash fields as in acquire.lua.

local key = KEYS[1]
if #KEYS == 2 and redis.call('GET', KEYS[2]) ~= ARGV[#ARGV] then
  return -1
end
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local pu_new, ps_new, pl_new, pn_new = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local keep = now
local st = state_read(key)
local dirty = false

local inst = ARGV[7]
local a = 9
for _ = 1, tonumber(ARGV[8]) do
  local kind, f, id, add, mode = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4]
  a = a + 5
  local current, nxt = period(kind, now, off)
  if id == current or id == current + 1 then
    local mf, pf = f .. '.m.' .. inst, f .. '.mp.' .. inst
    local used, next = counts(st[f .. '.p'] or -1e18, st[f .. '.n'] or 0, st[f .. '.q'] or 0, current)
    local mine = 0
    if st[pf] == current then mine = st[mf] or 0 end
    if id == current then
      if mode == 't' then
        if add > mine then
          used = used + add - mine
          mine = add
        end
      else
        used = used + add
        mine = mine + add
      end
      if inst ~= '' then st[mf], st[pf] = mine, current end
    else
      next = next + add
    end
    st[f .. '.p'], st[f .. '.n'], st[f .. '.q'] = current, used, next
    dirty = true
    local k = nxt
    if next > 0 then
      local _, after = period(kind, nxt, off)
      k = after
    end
    if k > keep then keep = k end
  end
end

if pu_new > now then
  local pu = st.pu or 0
  if pu_new > pu then
    st.pu, st.ps, st.pl, st.pn = pu_new, ps_new, pl_new, pn_new
    dirty = true
    if pu_new + pn_new > keep then keep = pu_new + pn_new end
  end
end

-- Keep the key while what was written matters; never shorten its TTL.
local ms
if dirty and keep > now then
  ms = math.floor((keep - now) / 1000) + 1000
  if redis.call('PTTL', key) < ms then
    st.ex = now + ms * 1000
  else
    ms = nil
  end
end
if dirty then state_write(key, st) end
if ms then redis.call('PEXPIRE', key, ms) end
return now
