-- prelude.lua: helpers shared by every script. wxgate prepends this file to
-- each script before loading it (Redis scripts cannot include one another).

-- The store's clock: Redis TIME in microseconds, unless a test passed one.
local function store_now(given)
  if given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integer as a string without exponent (exact below 2^53). '%d' (a C
-- long in Redis's Lua 5.1) is several times cheaper than '%.0f', which goes
-- through glibc's multi-precision float printing; callers pass integers.
local function fmt(x)
  return string.format('%d', x)
end

