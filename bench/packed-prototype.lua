-- bench/packed-prototype.lua: NOT USED BY WXGATE. A measuring prototype for
-- docs/performance.md ("Session 16"): the decision of acquire.lua for one
-- call of a window + day rule with an instance id (no share, no recipients,
-- no concurrency, no warm-up, no reserve), with the pair's state packed in
-- one string value (struct.pack of ten doubles: one GET and one SET, no
-- field names, no number parsing) instead of a hash of decimal fields.
-- Same ARGV and answer as acquire.lua's single call; loaded after
-- lua/prelude.lua. Compare:
--   BENCH_ACQUIRE_BASE=bench/packed-prototype.lua bench/script-cost.sh
-- where only the "window+day, baseline" row is this prototype's cost (it
-- decides the first call only, and only that shape: the other baseline rows
-- are not meaningful).
local now = store_now(ARGV[1])
local off = tonumber(ARGV[2])
local key = KEYS[1]
local T, tau = tonumber(ARGV[13]), tonumber(ARGV[14])
local count = tonumber(ARGV[18])
local s = redis.call('GET', key)
local tat, p, n, q, m, mp, lc, ex, pu, pn = now, -1, 0, 0, 0, -1, 0, 0, 0, 0
if s then tat, p, n, q, m, mp, lc, ex, pu, pn = struct.unpack('<dddddddddd', s) end
if pu > now then return string.format('0 %d 3', pu - now) end
if tat < now then tat = now end
local wait = tat - tau - now
local id, nxt = period('day', now, off)
local used, nextc = counts(p, n, q, id)
if used >= count then return string.format('0 %d 2', nxt - now) end
if wait > 0 then return string.format('0 %d 1', wait) end
tat = tat + T
used = used + 1
if mp ~= id then m = 0 end
m = m + 1
local lives = ex - now
local ttl = nxt - now
redis.call('SET', key, struct.pack('<dddddddddd', tat, id, used, nextc, m, id, now, ex, pu, pn))
if lives < ttl then redis.call('PEXPIRE', key, math.floor(ttl / 1000) + 10000) end
local room = idiv(now + tau + T - tat, T)
return string.format('1 %d %d %d %d %d %d %d %d %d', now, 0, 0, 1, room, tat - now, 2, count - used, nxt - now)
