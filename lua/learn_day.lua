-- learn_day.lua: quota_sync (src/ops/quota_sync.rs). WeChat reports the
-- pair's day limit (quota/get's daily_limit): kept in the pair state, where
-- acquire.lua reads it. Mirrors src/limit/learned.rs (learn_day).
--
-- KEYS[1]  pair state: <prefix>:{<account>}:<state>
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  the day limit WeChat reports (0: says nothing, ignored)
-- ARGV[3]  how long a learned limit is kept after it was reported, µs
--
-- Fields: day.l = the limit, day.la = when it was reported.
-- Returns the learned limit before (0: none, or older than ARGV[3]). The key
-- lives at least ARGV[3] more (never shortened; `ex` says until when, as
-- acquire.lua keeps it).

local key = KEYS[1]
local now = store_now(ARGV[1])
local limit = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
local st = state_read(key)
local before = st['day.l'] or 0
local at = st['day.la'] or 0
if now >= at + keep then before = 0 end
if limit > 0 then
  local until_ = now + keep
  local ex = st.ex
  st['day.l'], st['day.la'] = limit, now
  if not ex or ex < until_ then
    st.ex = until_
    state_write(key, st)
    redis.call('PEXPIRE', key, fmt(idiv(keep, 1000) + 1000))
  else
    state_write(key, st)
  end
end
return before
