-- fields.lua: read fields of pair states, read only: the keeper's check of
-- the penalties of leased pairs and the ledger's calendar counts
-- (src/store/redis.rs), run as one pipeline of these.
--
-- KEYS[1]  state: <prefix>:{<account>}:<rule> (lua/prelude.lua state_read)
-- ARGV     field names
--
-- Returns each field's value in order (an integer, or nil when absent).

local st = state_read(KEYS[1])
local out = {}
for i = 1, #ARGV do
  out[i] = st[ARGV[i]] or false
end
return out
