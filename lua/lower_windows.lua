-- lower_windows.lua: WeChat answered a frequency 45009 for the pair
-- (learn_windows, src/features/penalties.rs, src/ops/quota_sync.rs): each
-- window of its rule that admitted at least its floor in the window before
-- is lowered until the next midnight of the quota zone to a share of what
-- it admitted, never below its floor nor below that share of the most
-- calls WeChat took in one window at an earlier 45009 of the day. Mirrors
-- src/limit/learned.rs (lower_windows, floor, took) and
-- WindowLimit::lowered step for step; the conformance table holds them
-- together.
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<state>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  the share kept, percent (90)
-- ARGV[4]  when the call WeChat refused was admitted: a window lowered at or
--          after it is left as it is (calls sent together lower it once)
-- ARGV[5]  the floor, percent of the configured count (10)
-- ARGV[6]  the floor's least (2)
-- then per window of the rule, seven values: field, W, margin M, count N,
--          burst B, T, τ (as configured)
--
-- Fields per window: <field> = TAT, <field>.r = when its current run began
-- (acquire.lua), and written here: <field>.ln / .lk / .lt / .lb = the
-- lowered count, burst, T and τ, .la = when, .lu = until when, .lh = the
-- most calls WeChat took in one window.
-- Returns per window its count before, after, the calls it admitted in the
-- window before (0 when not counted) and the outcome (0 lowered, 1 lowered
-- already for a call sent at or after this one, 2 too few calls, 3 at its
-- floor or what WeChat took), flattened.

local key = KEYS[1]
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local pct = tonumber(ARGV[3])
local sent_at = tonumber(ARGV[4])
local fpct, fmin = tonumber(ARGV[5]), tonumber(ARGV[6])
local _, until_ = period('day', now, off)
local out, wrote = {}, false
local st = state_read(key)
local function push(a, b, c, d)
  out[#out + 1] = a
  out[#out + 1] = b
  out[#out + 1] = c
  out[#out + 1] = d
end
for i = 7, #ARGV, 7 do
  local f = ARGV[i]
  local per, margin = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local n, b, t, tau = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  local cfg_n, cfg_b = n, b
  -- The window as it applies now: lowered until .lu, the stricter of the two.
  local lu = st[f .. '.lu']
  local again, la, lh = false, nil, 0
  if lu and lu > now then
    local ln, lt = st[f .. '.ln'], st[f .. '.lt']
    if ln and ln < n then n = ln end
    if lt and lt > t then t = lt end
    la = st[f .. '.la'] or 0
    lh = st[f .. '.lh'] or 0
    again = la >= sent_at
  end
  if again then
    push(n, n, 0, 1)
  else
    local tat = st[f] or now
    local run = st[f .. '.r'] or now
    local since = now - per
    if run > since then since = run end
    local admitted = 0
    if tat > since then admitted = idiv(tat - since, t) end
    -- floor(): 10 % of the configured count, at least 2.
    local fl = idiv(cfg_n * fpct + 99, 100)
    if fl < fmin then fl = fmin end
    local bound = idiv(lh * pct, 100)
    if bound < fl then bound = fl end
    local count = idiv(admitted * pct, 100)
    if count > n - 1 then count = n - 1 end
    if count < bound then count = bound end
    if admitted < fl then
      push(n, n, admitted, 2)
    elseif count >= n then
      push(n, n, admitted, 3)
    else
      -- took(): the run's calls before the refused one within the calendar
      -- window of length W that holds it (from the quota day's midnight),
      -- since the last lowering.
      local midnight = idiv(sent_at + off, DAY) * DAY - off
      local from = midnight + idiv(sent_at - midnight, per) * per
      if la and la > from then from = la end
      local took = 0
      if run > sent_at then
        took = 0
      elseif run >= from then
        took = idiv(sent_at - run + t - 1, t)
      elseif sent_at - from - tau > 0 then
        took = idiv(sent_at - from - tau, t)
      end
      if took < lh then took = lh end
      -- WindowLimit::lowered: the configured window with `count` calls, its
      -- burst at most the default burst of that count (5 %, at least 1).
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
        {'.ln', count}, {'.lk', burst}, {'.lt', interval}, {'.lb', tolerance}, {'.la', now}, {'.lu', until_},
        {'.lh', took}
      }) do
        st[f .. x[1]] = x[2]
      end
      wrote = true
      push(n, count, admitted, 0)
    end
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
