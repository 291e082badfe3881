-- lower_windows.lua: WeChat answered a frequency 45009 for the pair
-- (learn_windows, src/features/penalties.rs, src/ops/quota_sync.rs): each
-- window of its rule is lowered until the next midnight of the quota zone to
-- a share of what it admitted in the window before. Mirrors
-- src/limit/learned.rs (lower_windows) and WindowLimit::lowered; the
-- conformance table holds them together.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<state>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  the share kept, percent (90)
-- ARGV[4]  when the call WeChat refused was admitted: a window lowered at or
--          after it is left as it is (calls sent together lower it once)
-- then per window of the rule, seven values: field, W, margin M, count N,
--          burst B, T, τ (as configured)
--
-- Fields per window: <field> = TAT, <field>.r = when its current run began
-- (acquire.lua), and written here: <field>.ln / .lk / .lt / .lb = the
-- lowered count, burst, T and τ, .la = when, .lu = until when.
-- Returns each window's count before and after, flattened.

local key = KEYS[1]
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local pct = tonumber(ARGV[3])
local sent_at = tonumber(ARGV[4])
local _, until_ = period('day', now, off)
local out, wrote = {}, false
local st = state_read(key)
for i = 5, #ARGV, 7 do
  local f = ARGV[i]
  local per, margin = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local n, b, t, tau = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  -- The window as it applies now: lowered until .lu, the stricter of the two.
  local lu = st[f .. '.lu']
  local again = false
  if lu and lu > now then
    local ln, lt = st[f .. '.ln'], st[f .. '.lt']
    if ln and ln < n then n = ln end
    if lt and lt > t then t = lt end
    again = (st[f .. '.la'] or 0) >= sent_at
  end
  if again then
    out[#out + 1] = n
    out[#out + 1] = n
  else
    local tat = st[f] or now
    local run = st[f .. '.r'] or now
    local since = now - per
    if run > since then since = run end
    local admitted = 0
    if tat > since then admitted = idiv(tat - since, t) end
    local count = idiv(admitted * pct, 100)
    if count > n - 1 then count = n - 1 end
    if count < 1 then count = 1 end
    -- WindowLimit::lowered: the configured window with `count` calls, its
    -- burst at most the default burst of that count (5 %, at least 1).
    local cfg_n, cfg_b = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
    if count > cfg_n then count = cfg_n end
    local burst = math.ceil(count / 20)
    if burst < 1 then burst = 1 end
    if cfg_b < burst then burst = cfg_b end
    local slots = count - burst + 1
    if margin < 0 then margin = 0 end
    local interval = idiv(per + margin + slots - 1, slots)
    if interval < 1 then interval = 1 end
    local tolerance = (burst - 1) * interval
    for _, x in ipairs({
      {'.ln', count}, {'.lk', burst}, {'.lt', interval}, {'.lb', tolerance}, {'.la', now}, {'.lu', until_}
    }) do
      st[f .. x[1]] = x[2]
    end
    wrote = true
    out[#out + 1] = n
    out[#out + 1] = count
  end
end
if wrote then
  local ex = st.ex
  if not ex or ex < until_ then
    st.ex = until_
    state_write(key, st)
    redis.call('PEXPIRE', key, fmt(idiv(until_ - now, 1000) + 1000))
  else
    state_write(key, st)
  end
end
return out
