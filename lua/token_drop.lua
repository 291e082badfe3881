-- token_drop.lua: WeChat rejected a token (40001, 40014, 42001); its slot
-- drops it if it is still the slot's token, so that a token fetched since
-- is never dropped by a late rejection of the old one. Mirrors
-- src/store/memory/token_slots.rs (drop_token).
--
-- KEYS[1]  <prefix>:{#tokens}:by:<token hash>: the slot holding the token
-- ARGV[1]  <prefix>:{#tokens}: (the slot's entry key is this and its name)
-- ARGV[2]  the token's hash (hex)
-- ARGV[3]  now in microseconds, or "" to use Redis TIME (only tests pass a time)
-- ARGV[4]  the kinds of slot it may be dropped from, space-separated
--          ("wecom", "token stable"), or "" for any: a host rejects only
--          the tokens it issues (an OA token sent to qyapi is not stale)
--
-- The entry's key is read from KEYS[1], so it is not declared: every key of
-- the token cache carries the {#tokens} hash tag, so in a Redis Cluster it
-- lives in the same slot as KEYS[1].
--
-- Returns 1 if the token was dropped, else 0.

local slot = redis.call('GET', KEYS[1])
if not slot then return 0 end
local kinds = ARGV[4] or ''
if kinds ~= '' then
  local kind = string.match(slot, '^([^:]*):')
  local listed = false
  for k in string.gmatch(kinds, '%S+') do
    if k == kind then listed = true end
  end
  if not listed then return 0 end
end
local key = ARGV[1] .. slot
local now = store_now(ARGV[3])
local e = redis.call('HMGET', key, 'h', 'u')
if e[1] == ARGV[2] and (tonumber(e[2] or '0') or 0) > now then
  redis.call('DEL', key)
  return 1
end
return 0
