-- token_claim.lua: the token cache (src/features/token_cache.rs). A slot's cached
-- token if it is fresh enough; else its fetch lock, for one asker of any
-- number on any instance; else who holds it. Mirrors
-- src/store/memory/token_slots.rs (claim).
--
-- KEYS[1]  the slot's entry: <prefix>:{#tokens}:<slot>, a hash of
--          e (sealed token), u (until µs), f (stored at µs), h (token hash)
-- KEYS[2]  its fetch lock: <prefix>:{#tokens}:<slot>:lock, "<until µs>:" and
--          the holder's id, or "!" and the answer of a fetch that just failed
--          (until is store time; the key's TTL only collects it)
-- ARGV[1]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[2]  the asker's id
-- ARGV[3]  least time the token must have left, µs
-- ARGV[4]  it must have been stored after this, µs (each store of a slot is
--          later than the one before: token_fetched.lua)
-- ARGV[5]  how long the lock lasts, µs
--
-- Returns {kind, entry or answer, until (busy: when the entry was stored, 0
-- if none), now}; kind is cached, won, busy or failed.

local now = store_now(ARGV[1])
local e = redis.call('HMGET', KEYS[1], 'e', 'u', 'f')
if e[1] then
  local u = tonumber(e[2] or '0') or 0
  local f = tonumber(e[3] or '0') or 0
  if u - now > tonumber(ARGV[3]) and f > tonumber(ARGV[4]) then
    return {'cached', e[1], u, now}
  end
end
local l = redis.call('GET', KEYS[2])
if l then
  local untl, rest = string.match(l, '^(%d+):(.*)$')
  if untl and tonumber(untl) > now then
    if string.sub(rest, 1, 1) == '!' then
      return {'failed', string.sub(rest, 2), 0, now}
    end
    if rest == ARGV[2] then
      return {'won', '', 0, now}
    end
    return {'busy', '', tonumber(e[3] or '0') or 0, now}
  end
end
local span = tonumber(ARGV[5])
redis.call('SET', KEYS[2], fmt(now + span) .. ':' .. ARGV[2], 'PX', fmt(idiv(span + 999, 1000)))
return {'won', '', 0, now}
