-- acquire.lua: decide a batch of calls, atomically and in order.
-- Computes what src/limit/decide.rs (decide) computes, in the same numbered
-- steps and with the same integer arithmetic; only its shape differs (a
-- batch of calls per run, each pair state read and written once). The
-- conformance tests run one scenario table against both and compare whole
-- decisions. Change them together. Calendar helpers: lua/prelude.lua.
--
-- One run decides a batch of calls (1 to 64; of any accounts on one server,
-- of one account in a Redis Cluster, whose keys must share a slot; each call
-- names its own keys), each exactly as if it had run alone, one after
-- the other, at the same store time: wxgate sends the calls that arrive
-- while a batch is in flight as the next batch, so a busy instance runs one
-- script per round trip instead of one per call.
--
-- KEYS     per call, in call order, one (three with a warm-up or a
--          concurrency cap) and then one per recipient:
--            pair state:         <prefix>:{<account>}:<rule>
--            account warm-up:    <prefix>:{<account>}:#warm (last token refresh, µs)
--            concurrency slots:  <prefix>:{<account>}:<rule>:c (zset holder -> lease expiry)
--            each recipient's windows (per_recipient): <prefix>:{<account>}:<rule>#r:<id>
--              (packed as a pair state: field -> TAT, ex; R of them, R given in ARGV)
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (production always
--          passes ""; only tests pass a time, for determinism)
-- ARGV[2]  quota_timezone offset from UTC, µs
-- ARGV[3]  the deployment's epoch as this instance knows it, or "" (no
--          check). When given, the last KEY is <prefix>:#epoch, and a run
--          that finds another value there (Redis lost its data: restart
--          without persistence, an empty replica, FLUSHALL) decides nothing
--          and answers "E": the instance re-seeds what it knows first
--          (src/store/ledger.rs).
-- ARGV[4]  this instance's id ("" = none): each calendar quota of the rule
--          also counts this instance's own calls of the current period in
--          <field>.m.<id> (for period <field>.mp.<id>), which a top-up after
--          a failover reads (lua/reconcile.lua)
-- then, per call:
--          max wait: hold the call up to this long for its slot (0 = refuse instead)
--          holder id of this call (unique across instances; "" without a cap)
--          "=" when the call's spec is the previous call's, else the spec:
--          warm-up period, µs (0 = none)
--          concurrency cap (0 = none)
--          lease of a concurrency slot, µs
--          number of limits L, then the rule's limits, five values each:
--            kind, field, a, b, r
--            kind "w"   window limit: a = emission interval T, b = tolerance τ (µs);
--              "wl": the same, of a rule with learn_windows (its run start
--              <field>.r is kept; a lowered window <field>.lt/.lb until .lu
--              applies: lua/lower_windows.lua)
--            kind "day" | "month"  calendar quota: a = count, b = 1 when a day
--              limit WeChat reported may raise it (learn = "both"), else 0
--            r: what this call may not use (a normal caller's call of a rule
--            with a reserve; else 0): R·T for a window, calls for a calendar
--          the caller's label when the rule has a max_share, else "", then
--            (only with a label) each limit's share, two values each, in the
--            limits' order: a, b as above (T, τ of the share's window; the
--            share's count). Its state is in the same pair state, fields
--            <field>~<caller> (a label never holds "~" or ".").
--          the call's cost n (1 for a call): decided as n calls at the same
--            moment, all or none; refused whatever the wait when a window's
--            tolerance cannot hold n at once (or a calendar quota n)
--          the number P of per-recipient windows, then P × (field, T, τ)
--          (the spec ends here)
--          the number R of recipient keys of this call (0 without P); each
--            recipient costs 1 against its own windows (no warm-up), all or
--            nothing with the rule's limits
--
-- Returns one flat array of integers: per call, in order (no nesting, no
-- number printed: string.format's ten integers cost Redis about 12,000
-- instructions a call, the array about 10,000, and the client reads
-- integers without splitting a string):
--         1 at escalated hold_us qi qr qt ci cr ct  admitted: forward at
--             `at` (now + hold_us); limit qi (1-based; 0 = none) has least
--             room left: qr calls, whole again / reset in qt µs; ci, cr, ct
--             the same among the calendar quotas only (ci 0: the rule has
--             none)
--         0 wait_us reason m j1…jm  refused; reason 1 rate, 2 quota, 3 penalty, 4 concurrency,
--             5 reserve (refused only because what is left is the reserve),
--             6 share (the caller's max_share of a limit is what refuses),
--             7 recipient (a recipient's own window is what refuses); j…:
--             the 0-based indices of the m recipients over their own windows
--
-- State fields (one packed value: lua/prelude.lua state_read): <field> = GCRA theoretical arrival time (window limits);
-- <field>.p / .n / .q = period id / calls counted in it / calls reserved for
-- the period after it (calendar quotas); ws / lc = warm-up start (only with
-- a warm-up) / last call;
-- pu, ps, pl, pn = penalty until, started, level, last length; ex = when the
-- key expires (µs, as last set by a script; saves a PTTL per call);
-- le = the latest lease's end, le.<id> / lu.<id> = an instance's last lease's
-- end and units (lua/lease.lua), cl = the last clear_quota (lua/clear.lua).
-- A refusal writes nothing (but expired concurrency leases are purged). An
-- admission writes what it changed and sets the key's TTL to the longest time
-- any of its state still matters.

local function num(s, default)
  if s == nil or s == false then return default end
  return tonumber(s) or default
end

local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])

-- period(kind, t, off), kept for t = now: every call of a run asks it.
local now_periods = {}
local function period_of(kind, t)
  if t ~= now then return period(kind, t, off) end
  local p = now_periods[kind]
  if not p then
    local id, nxt = period(kind, t, off)
    p = {id, nxt}
    now_periods[kind] = p
  end
  return p[1], p[2]
end

-- Earliest time >= t at which a calendar quota has room.
local function calendar_free_at(kind, p, n, q, count, t)
  local id, nxt = period_of(kind, t)
  local used, next = counts(p, n, q, id)
  if used < count then return t end
  if next < count then return nxt end
  local _, after = period_of(kind, nxt)
  return after
end
local inst = ARGV[4]
-- How long a day limit WeChat reported (day.l, reported at day.la) applies:
-- src/limit/learned.rs KEEP_US (a test keeps the two equal).
local KEEP_LEARNED = 172800000000
-- src/limit/lease.rs RESERVE_RETRY_US.
local RESERVE_RETRY = 1000000
-- A calendar quota's field names (count, period, reservations; this
-- instance's count and its period), made once per field per run: the calls
-- of a batch share them.
local calendar_names = {}
local function names(f)
  local nm = calendar_names[f]
  if not nm then
    nm = {p = f .. '.p', n = f .. '.n', q = f .. '.q', m = f .. '.m.' .. inst, mp = f .. '.mp.' .. inst, l = f .. '.l', la = f .. '.la'}
    calendar_names[f] = nm
  end
  return nm
end
local nkeys = #KEYS
if ARGV[3] ~= '' then
  nkeys = nkeys - 1
  if redis.call('GET', KEYS[#KEYS]) ~= ARGV[3] then
    return 'E'
  end
end

-- States read and written by this run: key -> {v = field -> number (nil if
-- absent), dirty = true once changed, extend = ms or nil}. Calls of one
-- batch often share a key: it is read once (state_read, lua/prelude.lua)
-- and written once for all of them.
local states = {}

-- `key`'s cached state (read whole the first time this run needs it).
local function load(key)
  local st = states[key]
  if not st then
    st = {v = state_read(key)}
    states[key] = st
  end
  return st
end

-- The share limits of a call without one (never written to).
local NONE = {}

-- Sets field f of st to x; a field that keeps its value is not written
-- (a calendar quota's period and reservations change once a day at most).
local function put(st, f, x)
  local v = st.v
  if v[f] ~= x then
    v[f] = x
    st.dirty = true
  end
end

-- The earliest moment every limit of `all` (the rule's, then the caller's
-- share's) admits a call of `cost` (keeping each rule limit's r when
-- `keep`), the reason code of the limit that set it, and whether any wait
-- can make room for it (earliest in decide.rs). Each limit carries its code
-- (1 rate, 2 quota, 6 share) and, for a window, its emission interval now
-- (l.t: warm-up's for the rule's, T for a share's).
local function earliest(all, now, off, keep, cost, rwaits)
  local worst, reason, fits = 0, 1, true
  local extra = cost - 1
  for i = 1, #all do
    local l = all[i]
    local kept = 0
    if keep then kept = l.r end
    local wait
    if l.kind == 'w' then
      local tat = l.tat or now
      if tat < now then tat = now end
      local more = extra * l.t
      if more > 0 and more + kept > l.b then fits = false end
      wait = tat - l.b + kept + more - now
    else
      local room = l.a - kept - extra
      if room < 0 then room = 0 end
      if extra > 0 and room == 0 then fits = false end
      wait = calendar_free_at(l.kind, l.p, l.n, l.q, room, now) - now
    end
    if wait > worst then
      worst = wait
      reason = l.code
    end
  end
  -- Each recipient's own windows, after the rule's (whose reason wins a tie).
  for i = 1, #rwaits do
    if rwaits[i] > worst then
      worst = rwaits[i]
      reason = 7
    end
  end
  -- A hold can cross midnight: the next period must have room too (with
  -- no wait, the loop above has checked this moment already).
  local at = now + worst
  for i = 1, worst > 0 and #all or 0 do
    local l = all[i]
    if l.kind ~= 'w' then
      local kept = 0
      if keep then kept = l.r end
      local room = l.a - kept - extra
      if room < 0 then room = 0 end
      local free = calendar_free_at(l.kind, l.p, l.n, l.q, room, at)
      if free > at then
        at = free
        reason = l.code
      end
    end
  end
  return at, reason, fits
end

-- Debits a calendar limit `l` for a call admitted at `at`: its period's
-- count, or the next period's; `mine`: the rule's own limit (not a share),
-- whose count of this instance's calls goes up too. Returns the counts and
-- the period's end.
local function count_call(st, l, now, at, off, cost, mine)
  local current, nxt = period_of(l.kind, now)
  local used, next = counts(l.p, l.n, l.q, current)
  local at_id = current
  if at ~= now then at_id = period_of(l.kind, at) end
  if at_id == current then used = used + cost else next = next + cost end
  local nm = l.nm
  put(st, nm.p, current)
  put(st, nm.n, used)
  put(st, nm.q, next)
  if mine and inst ~= '' then
    local mf, pf = nm.m, nm.mp
    local m = 0
    if st.v[pf] == current then
      m = st.v[mf] or 0
    else
      put(st, pf, current)
      put(st, mf, 0)
    end
    if at_id == current then put(st, mf, m + cost) end
  end
  local keep = nxt
  if next > 0 then
    local _, after = period_of(l.kind, nxt)
    keep = after
  end
  return used, nxt, keep
end

-- The limit with least room left so far (i, room, reset), updated.
local function tightest(qi, qr, qt, i, room, reset)
  if qi == 0 or room < qr then return i, room, reset end
  return qi, qr, qt
end

-- The run's answer (the integers above) and its length: made with room
-- for 16 (grown twice fewer times; the end is marked by a nil at no + 1).
local out, no = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0
local function refused(wait, reason)
  out[no + 1], out[no + 2], out[no + 3], out[no + 4] = 0, wait, reason, 0
  no = no + 4
end

-- A call's rule as the client sent it (everything but its max wait, holder
-- and recipients), parsed from ARGV[a] on: the table spec and where the
-- values after it start. A call whose spec is the previous call's sends
-- "=" instead (acquire below): it is parsed once per run, not per call.
local function parse_spec(a)
  local warmup = tonumber(ARGV[a])
  local conc = tonumber(ARGV[a + 1])
  local lease = tonumber(ARGV[a + 2])
  local last = a + 3 + 5 * tonumber(ARGV[a + 3])
  local caller = ARGV[last + 1]
  local next_a = last + 2

  local limits = {}
  local normal = false
  for i = a + 4, last, 5 do
    -- Every field a call sets is in the constructor: the table is sized
    -- once, not grown field by field. a0, b0: a and b as sent (a call may
    -- lower them: learned limits).
    local l = {kind = ARGV[i], f = ARGV[i + 1], a = tonumber(ARGV[i + 2]), b = tonumber(ARGV[i + 3]), r = tonumber(ARGV[i + 4]), code = 1,
      learn = false, nm = false, tat = false, t = 0, p = 0, n = 0, q = 0, a0 = 0, b0 = 0}
    l.a0, l.b0 = l.a, l.b
    if l.kind == 'wl' then
      l.kind, l.learn = 'w', true
    elseif l.kind ~= 'w' then
      l.code = 2
    end
    if l.r > 0 then normal = true end
    limits[#limits + 1] = l
  end
  -- The caller's share: the same limits, scaled, in fields of its own.
  -- `all`: the rule's limits then the share's (the rule's alone without one).
  local shares, all = NONE, limits
  if caller ~= '' then
    shares, all = {}, {}
    local n = #limits
    for i = 1, n do
      local l = limits[i]
      local j = next_a + 2 * (i - 1)
      local x, y = tonumber(ARGV[j]), tonumber(ARGV[j + 1])
      shares[i] = {kind = l.kind, f = l.f .. '~' .. caller, a = x, b = y, r = 0, code = 6, a0 = x, b0 = y}
      all[i] = l
      all[n + i] = shares[i]
    end
    next_a = next_a + 2 * n
  end
  local cost = tonumber(ARGV[next_a]) or 1
  next_a = next_a + 1
  -- Per-recipient windows.
  local np = tonumber(ARGV[next_a]) or 0
  local pr = NONE
  if np > 0 then pr = {} end
  for i = 1, np do
    local j = next_a + 1 + 3 * (i - 1)
    pr[i] = {f = ARGV[j], t = tonumber(ARGV[j + 1]), b = tonumber(ARGV[j + 2])}
  end
  next_a = next_a + 1 + 3 * np
  -- Each limit's field names (a calendar quota's made once per run).
  for i = 1, #all do
    local l = all[i]
    if l.kind == 'w' then
      if l.learn then
        local f = l.f
        l.lr, l.lt, l.lb, l.lu = f .. '.r', f .. '.lt', f .. '.lb', f .. '.lu'
      end
    else
      l.nm = names(l.f)
    end
  end
  return {warmup = warmup, conc = conc, lease = lease, limits = limits, shares = shares, all = all, normal = normal,
    cost = cost, np = np, pr = pr}, next_a
end

-- The spec of the run's previous call (for "=").
local last_spec

-- Decides the call whose keys start at KEYS[k] and whose values start at
-- ARGV[a], appending its answer to `out`. Returns where the next call's
-- values and keys start. Its keys: the pair state, then (only with a
-- warm-up or a concurrency cap) the account's warm-up key and the rule's
-- slots, then its recipients'.
local function acquire(k, a)
  local max_wait = tonumber(ARGV[a])
  local holder = ARGV[a + 1]
  local spec
  if ARGV[a + 2] == '=' then
    spec, a = last_spec, a + 3
  else
    spec, a = parse_spec(a + 2)
    last_spec = spec
  end
  local nr = tonumber(ARGV[a]) or 0
  local next_a = a + 1
  local warmup, conc, lease, limits, shares, all = spec.warmup, spec.conc, spec.lease, spec.limits, spec.shares, spec.all
  local normal, cost, np, pr = spec.normal, spec.cost, spec.np, spec.pr
  local key, warm_key, conc_key = KEYS[k], nil, nil
  local extra = 0
  if warmup > 0 or conc > 0 then
    warm_key, conc_key, extra = KEYS[k + 1], KEYS[k + 2], 2
  end
  local next_k = k + 1 + extra + nr
  for i = 1, #all do
    local l = all[i]
    l.a, l.b = l.a0, l.b0
  end
  local st = load(key)
  local sv = st.v
  local pu, pn, ws, lc = sv.pu or 0, sv.pn or 0, sv.ws or 0, sv.lc or 0
  local ex = sv.ex or nil
  for i = 1, #all do
    local l = all[i]
    if l.kind == 'w' then
      l.tat = sv[l.f] or nil
      -- learn_windows: a window a frequency 45009 lowered until the quota
      -- day ends applies as the stricter T and tolerance of the two.
      if l.learn then
        local lu = sv[l.lu]
        if lu and lu > now then
          local lt, lb = sv[l.lt], sv[l.lb]
          if lt and lt > l.a then l.a = lt end
          if lb and lb < l.b then l.b = lb end
        end
      end
    else
      local nm = l.nm
      l.p, l.n, l.q = sv[nm.p] or -1e18, sv[nm.n] or 0, sv[nm.q] or 0
      -- The rule's own day quota: the day limit WeChat reported, while
      -- fresh, lowers it (raises it too when b = 1, learn = "both").
      if l.code == 2 and l.kind == 'day' then
        local learned, la = sv[nm.l], sv[nm.la]
        if learned and la and now < la + KEEP_LEARNED and (l.b == 1 or learned < l.a) then l.a = learned end
      end
    end
  end

  -- 1. A penalty refuses at once and consumes nothing.
  if pu > now then
    refused(pu - now, 3)
    return next_a, next_k
  end
  -- 2. Concurrency: expired leases (a crashed instance's) free their slots.
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', conc_key, '-inf', fmt(now))
    if redis.call('ZCARD', conc_key) >= conc then
      local first = redis.call('ZRANGE', conc_key, 0, 0, 'WITHSCORES')
      refused(tonumber(first[2]) - now, 4)
      return next_a, next_k
    end
  end
  -- 3. Warm-up restarts when the pair was idle for a whole warm-up period.
  local cold = (lc == 0) or (now - lc >= warmup)
  local warm_start = ws
  if cold then warm_start = now end
  if warmup > 0 then
    local aw = num(redis.call('GET', warm_key), 0)
    if aw > warm_start then warm_start = aw end
  end

  -- Each window's emission interval now: T / f under warm-up for the
  -- rule's, T for a share's.
  for i = 1, #all do
    local l = all[i]
    if l.kind == 'w' then
      l.t = l.a
      if warmup > 0 and l.code ~= 6 then
        local elapsed = now - warm_start
        if elapsed < 0 then elapsed = 0 end
        if elapsed > warmup then elapsed = warmup end
        l.t = math.ceil(l.a * (2 * warmup) / (warmup + elapsed))
      end
    end
  end

  -- Each recipient's state and own wait (the largest of its windows').
  local rsts, rwaits = NONE, NONE
  if nr > 0 then rsts, rwaits = {}, {} end
  for r = 1, nr do
    local rst = load(KEYS[k + extra + r])
    local w = 0
    for i = 1, np do
      local p = pr[i]
      local tat = rst.v[p.f] or now
      if tat < now then tat = now end
      if tat - p.b - now > w then w = tat - p.b - now end
    end
    rsts[r], rwaits[r] = rst, w
  end

  -- 4. Each limit's own wait from now; the largest decides (first on ties).
  --    A normal call of a rule with a reserve must leave it (r); whether a
  --    high call would be admitted tells a reserve refusal apart. A call
  --    costing n needs room for n at once.
  local at, reason, fits = earliest(all, now, off, normal, cost, rwaits)
  local wait = at - now
  if wait > max_wait or not fits then
    if normal then
      local plain, plain_reason, plain_fits = earliest(all, now, off, false, cost, rwaits)
      if plain_fits and plain - now <= max_wait then reason = 5 else reason = plain_reason end
    end
    -- A calendar quota partly held in a reserve (le.<id>#r live, lu.<id>#r
    -- units left): try again in a second, not at the period's end
    -- (src/limit/lease.rs RESERVE_RETRY_US; never a hold on that room).
    if reason == 2 and wait > RESERVE_RETRY then
      local v = st.v
      for f, x in pairs(v) do
        if type(x) == 'number' and x > now and string.sub(f, 1, 3) == 'le.' and string.sub(f, -2) == '#r'
          and (tonumber(v['lu.' .. string.sub(f, 4)]) or 0) > 0 then
          wait = RESERVE_RETRY
          break
        end
      end
    end
    refused(wait, reason)
    local m = no
    for r = 1, nr do
      if rwaits[r] > max_wait then
        no = no + 1
        out[no] = r - 1
      end
    end
    out[m] = no - m
    return next_a, next_k
  end

  -- 5. Admit at `at`: debit everything (written when the run ends).
  local ttl = 0
  local qi, qr, qt = 0, 0, 0
  local ci, cr, ct = 0, 0, 0
  for i, l in ipairs(limits) do
    if l.kind == 'w' then
      local tat = l.tat or at
      if tat < at then
        tat = at
        -- learn_windows: a TAT found in the past starts a new run.
        if l.learn then put(st, l.lr, at) end
      elseif l.learn and not l.tat then
        put(st, l.lr, at)
      end
      local t = cost * l.t
      put(st, l.f, tat + t)
      if tat + t - now > ttl then ttl = tat + t - now end
      local room = idiv(now + l.b + l.a - (tat + t), l.a)
      if room < 0 then room = 0 end
      qi, qr, qt = tightest(qi, qr, qt, i, room, tat + t - now)
    else
      local used, nxt, keep = count_call(st, l, now, at, off, cost, true)
      local room = l.a - used
      if room < 0 then room = 0 end
      qi, qr, qt = tightest(qi, qr, qt, i, room, nxt - now)
      ci, cr, ct = tightest(ci, cr, ct, i, room, nxt - now)
      if keep - now > ttl then ttl = keep - now end
    end
  end
  -- The caller's share (no warm-up: the rule's windows slow it already).
  for _, l in ipairs(shares) do
    if l.kind == 'w' then
      local tat = l.tat or at
      if tat < at then tat = at end
      put(st, l.f, tat + cost * l.a)
      if tat + cost * l.a - now > ttl then ttl = tat + cost * l.a - now end
    else
      local _, _, keep = count_call(st, l, now, at, off, cost, false)
      if keep - now > ttl then ttl = keep - now end
    end
  end
  -- Each recipient's windows, each key kept as long as its last TAT.
  for r = 1, nr do
    local rst = rsts[r]
    local rttl = 0
    for i = 1, np do
      local p = pr[i]
      local tat = rst.v[p.f] or at
      if tat < at then tat = at end
      put(rst, p.f, tat + p.t)
      if tat + p.t - now > rttl then rttl = tat + p.t - now end
    end
    local rms = math.floor(rttl / 1000) + 1000
    local rlives = -1
    if rst.v.ex then rlives = rst.v.ex - now end
    if rlives < rms * 1000 then
      local extend = rms + 10000
      put(rst, 'ex', now + extend * 1000)
      if not rst.extend or extend > rst.extend then rst.extend = extend end
    end
  end
  if cold and warmup > 0 then put(st, 'ws', now) end
  put(st, 'lc', now)
  if pu + pn - now > ttl then ttl = pu + pn - now end
  if warmup > ttl then ttl = warmup end
  -- Never shorten a TTL another rule version or a penalty set. `ex` says how
  -- long the key lives already; only a key without it (written by an older
  -- wxgate) needs a PTTL. Extending adds slack so that a busy key is extended
  -- about once per 10 s, not on every call.
  local ms = math.floor(ttl / 1000) + 1000
  local lives = -1
  if ex then
    lives = ex - now
  elseif lc ~= 0 or pu ~= 0 then
    lives = redis.call('PTTL', key) * 1000
  end
  if lives < ms * 1000 then
    local extend = ms + 10000
    put(st, 'ex', now + extend * 1000)
    if not st.extend or extend > st.extend then st.extend = extend end
  end
  if conc > 0 then
    redis.call('ZADD', conc_key, fmt(at + lease), holder)
    local cms = math.floor((at + lease - now) / 1000) + 1000
    if redis.call('PTTL', conc_key) < cms then
      redis.call('PEXPIRE', conc_key, cms)
    end
  end

  local escalated = 0
  if pn > 0 and now < pu + pn then escalated = 1 end
  out[no + 1], out[no + 2], out[no + 3], out[no + 4], out[no + 5] = 1, at, escalated, wait, qi
  out[no + 6], out[no + 7], out[no + 8], out[no + 9], out[no + 10] = qr, qt, ci, cr, ct
  no = no + 10
  return next_a, next_k
end

local a, k = 5, 1
while k <= nkeys do
  a, k = acquire(k, a)
end
out[no + 1] = nil
-- Write what the admissions changed: one SET per key, with its TTL when it
-- must be extended (put never stores false: the state is clean).
for key, st in pairs(states) do
  if st.dirty then
    state_put(key, st.v, st.extend)
  end
end
return out
