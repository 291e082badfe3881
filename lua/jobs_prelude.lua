-- jobs_prelude.lua: helpers shared by the jobs_*.lua scripts (queued
-- delivery, src/store/jobs/redis.rs), prepended after prelude.lua.
--
-- Every jobs script runs on the keys of one account, all under its hash tag
-- (one Cluster slot). ARGV[1] is what they start with,
-- B = <prefix>:{<account>}:#jobs: , and KEYS[1] is B .. 'meta' (declared,
-- so the script is routed to the account's slot); the others are built
-- from B (same tag, same slot):
--
--   B..'meta'     hash: seq (last seq), n (jobs stored, ended included),
--                 j, b (unfinished jobs and body bytes of the account),
--                 j:<caller>, b:<caller> (the same of one caller),
--                 kept (Bounds::ended_jobs as the latest submission gave it)
--   B..'j:'..id   hash: one job but its body (src/store/jobs/redis.rs `job_from`)
--   B..'b:'..id   string: its body (apart, so the hash of small fields stays
--                 a compact listpack); deleted when the job ends
--   B..'q:'..caller..':'..rule
--                 zset: a queue's unfinished jobs by seq
--   B..'qs'       set: caller..'\n'..rule of the queues with unfinished jobs
--   B..'leases'   zset: claimed and sending jobs by lease end
--   B..'ended'    zset: ended jobs by the time they ended (for purge)
--   B..'e:'..caller
--                 zset: the caller's ended jobs, by the time they ended,
--                 pending callbacks included (kept at most `kept`: end_job)
--   B..'counts'   hash: caller..'\n'..rule..'\n'..state -> jobs (summary)
--   B..'idem'     hash: caller..'\n'..key -> the first job's id
--   B..'idemx'    zset: the same members by when they stop counting
--   B..'dl'       zset: unfinished jobs with a deadline, by it (jobs_expire.lua;
--                 a claimed or sending one stays in it: its holder ends it)
--   B..'hd'       hash: caller..'\n'..rule -> the queue's head as last set
--                 (lower_head, set_head below)
--   B..'cbs'      zset: ended jobs whose callback is pending, by when it is
--                 due (such a job is put in 'ended' only once its callback
--                 is done, so purge keeps it); the job's hash holds 'cbd'
--                 (that due time) and 'cbn' (times handed out)
--
-- States are stored by name: queued waiting claimed sending sent failed
-- expired cancelled unknown. Times are wxgate's (given, never Redis TIME).

local B = ARGV[1]
local META = B .. 'meta'

local function jkey(id)
  return B .. 'j:' .. id
end

local function bkey(id)
  return B .. 'b:' .. id
end

local function qkey(caller, rule)
  return B .. 'q:' .. caller .. ':' .. rule
end

-- Moves `d` jobs of a queue in or out of `state` in the summary's counts.
local function count(caller, rule, state, d)
  local f = caller .. '\n' .. rule .. '\n' .. state
  if redis.call('HINCRBY', B .. 'counts', f, d) <= 0 then
    redis.call('HDEL', B .. 'counts', f)
  end
end

local function unfinished(state)
  return state == 'queued' or state == 'waiting' or state == 'claimed' or state == 'sending'
end

-- A job's lanes ('ln': its recipients hashed, space-separated; '*' its
-- whole queue; '' none; absent: stored before lanes, '*'). The walk below
-- is the twin of src/jobs.rs `LaneScan`: a job is free when no unfinished
-- job before it in its queue shares a lane (a '*' job: when none is before
-- it; after a '*' job none is free).
local function lanes_visit(s, ln)
  local free
  if s.all then
    free = false
  elseif ln == '*' then
    free = not s.seen
  else
    free = true
    for l in string.gmatch(ln, '%S+') do
      if s.taken[l] then
        free = false
        break
      end
    end
  end
  s.seen = true
  if ln == '*' then
    s.all = true
  else
    for l in string.gmatch(ln, '%S+') do
      s.taken[l] = true
    end
  end
  return free
end

-- Walks the first `limit` unfinished jobs of a queue in seq order: calls
-- pick(id, key, state) for at most `max` free jobs due by `now`, and
-- returns the earliest due time of a free job left (queued or waiting),
-- or -1: the queue's head for the index of due queues.
local function scan(caller, rule, now, max, limit, pick)
  local s = {taken = {}, seen = false, all = false}
  local nxt, picked = -1, 0
  for _, id in ipairs(redis.call('ZRANGE', qkey(caller, rule), 0, limit - 1)) do
    local k = jkey(id)
    local f = redis.call('HMGET', k, 'st', 'due', 'ln')
    local free = lanes_visit(s, f[3] or '*')
    if free and (f[1] == 'queued' or f[1] == 'waiting') then
      local due = tonumber(f[2])
      if due <= now and picked < max then
        pick(id, k, f[1])
        picked = picked + 1
      elseif nxt < 0 or due < nxt then
        nxt = due
      end
    end
    if picked >= max and nxt >= 0 and nxt <= now then
      break
    end
  end
  return nxt
end

-- Most unfinished jobs a claim (or a head) looks at (src/jobs.rs CLAIM_SCAN).
local CLAIM_SCAN = 512

-- B..'hd' (hash caller\nrule -> due time) is each queue's head as last
-- set here: what the client last wrote into the index of due queues.
local function set_head(caller, rule, h)
  if h < 0 then
    redis.call('HDEL', B .. 'hd', caller .. '\n' .. rule)
  else
    redis.call('HSET', B .. 'hd', caller .. '\n' .. rule, h)
  end
  return h
end

-- A queue's exact head (jobs_claim.lua walks itself; jobs_recover.lua).
local function head(caller, rule, now)
  return set_head(caller, rule, scan(caller, rule, now, 0, CLAIM_SCAN, nil))
end

-- After a write that may have made a job free to claim from `at` on (a
-- submission; a job ended, cancelled or expired, its lanes freed; a job
-- handed back until `at`): the head lowered to `at`, with no walk (O(1)
-- whatever is in flight at the queue's front). Returns the head (written
-- into the index again even when it did not move: that repairs an index
-- write that crossed another), or -1 when the queue has no unfinished job.
-- Never too late; too early at worst (nothing was freed after all): that
-- costs one claim, whose walk sets the exact head (only a claim and
-- jobs_recover.lua walk, and only they raise it).
local function lower_head(caller, rule, at)
  if redis.call('EXISTS', qkey(caller, rule)) == 0 then
    return set_head(caller, rule, -1)
  end
  local h = tonumber(redis.call('HGET', B .. 'hd', caller .. '\n' .. rule) or '-1')
  if h >= 0 and h <= at then
    return h
  end
  return set_head(caller, rule, at)
end

-- A caller's unfinished jobs and bytes in this account.
local function caller_totals(caller)
  local t = redis.call('HMGET', META, 'j:' .. caller, 'b:' .. caller)
  return tonumber(t[1] or '0'), tonumber(t[2] or '0')
end

-- Deletes ended job `id` of `caller` (the oldest past the bound of kept
-- ended jobs, or one purge takes), with the Idempotency-Key that names it.
-- Returns whether its callback was pending (given up with it).
local function forget(id, caller)
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'r', 'st', 'ik', 'cbd')
  if f[2] then
    count(caller, f[1], f[2], -1)
    redis.call('HINCRBY', META, 'n', -1)
    if f[3] then
      local member = caller .. '\n' .. f[3]
      if redis.call('HGET', B .. 'idem', member) == id then
        redis.call('HDEL', B .. 'idem', member)
        redis.call('ZREM', B .. 'idemx', member)
      end
    end
    redis.call('DEL', k, bkey(id))
  end
  redis.call('ZREM', B .. 'ended', id)
  redis.call('ZREM', B .. 'cbs', id)
  redis.call('ZREM', B .. 'e:' .. caller, id)
  return f[4] ~= false and f[4] ~= nil
end

-- Most jobs one end deletes past `kept` (as src/jobs/sqlite.rs
-- EVICT_PER_END): a caller already past it comes back under it one job per
-- end, and no end does unbounded work.
local EVICT_PER_END = 2

-- Keeps `caller`'s ended jobs in this account at `kept` (none before a
-- submission gave it): past it, forgets the oldest (by when they ended,
-- ties by id). Returns whether a pending callback went.
local function kept(caller)
  local most = tonumber(redis.call('HGET', META, 'kept') or '-1')
  if most < 0 then
    return false
  end
  local e = B .. 'e:' .. caller
  local dropped = false
  for _ = 1, math.min(EVICT_PER_END, redis.call('ZCARD', e) - most) do
    local oldest = redis.call('ZRANGE', e, 0, 0)[1]
    if not oldest then
      break
    end
    if forget(oldest, caller) then
      dropped = true
    end
  end
  return dropped
end

-- Ends job `id` of queue (caller, rule), now in unfinished state `from`,
-- as `to` at `now`: out of its queue and the leases, into `ended` (or, with
-- a callback, into 'cbs': its callback pending), its body deleted, its jobs
-- and bytes no longer counted against the bounds, counted in the caller's
-- kept ended jobs (kept()). Returns whether pending callbacks changed.
local function end_job(id, caller, rule, from, to, now)
  local k = jkey(id)
  local size = tonumber(redis.call('HGET', k, 'sz') or '0')
  redis.call('HSET', k, 'st', to, 'up', fmt(now), 'l', '0')
  redis.call('HDEL', k, 'o')
  redis.call('DEL', bkey(id))
  redis.call('ZADD', B .. 'e:' .. caller, now, id)
  local q = qkey(caller, rule)
  redis.call('ZREM', q, id)
  if redis.call('EXISTS', q) == 0 then
    redis.call('SREM', B .. 'qs', caller .. '\n' .. rule)
  end
  redis.call('ZREM', B .. 'leases', id)
  redis.call('ZREM', B .. 'dl', id)
  if redis.call('HEXISTS', k, 'cb') == 1 then
    -- Its callback pending, due now, in the script that ended it.
    redis.call('HSET', k, 'cbd', fmt(now), 'cbn', '0')
    redis.call('ZADD', B .. 'cbs', now, id)
  else
    redis.call('ZADD', B .. 'ended', now, id)
  end
  count(caller, rule, from, -1)
  count(caller, rule, to, 1)
  redis.call('HINCRBY', META, 'j', -1)
  redis.call('HINCRBY', META, 'b', -size)
  redis.call('HINCRBY', META, 'j:' .. caller, -1)
  redis.call('HINCRBY', META, 'b:' .. caller, -size)
  local called = redis.call('HEXISTS', k, 'cb') == 1
  if kept(caller) then
    called = true
  end
  return called
end

-- Back to waiting for its turn (`state`: queued or waiting), due at `due`,
-- no longer leased.
local function unlease(id, caller, rule, from, state, due, now)
  local k = jkey(id)
  redis.call('HSET', k, 'st', state, 'due', fmt(due), 'up', fmt(now), 'l', '0')
  redis.call('HDEL', k, 'o')
  redis.call('ZREM', B .. 'leases', id)
  count(caller, rule, from, -1)
  count(caller, rule, state, 1)
end


-- The lowest score of the account's zset `B..name`, or -1 when it is empty
-- (what the indexes of accounts, e.g. `{#jobs}:callbacks`, hold).
local function earliest(name)
  local h = redis.call('ZRANGE', B .. name, 0, 0, 'WITHSCORES')
  if #h == 0 then
    return -1
  end
  return tonumber(h[2])
end

-- The account's earliest pending callback's due time, or -1 (for the
-- index of accounts with pending callbacks, `{#jobs}:callbacks`).
local function callback_head()
  return earliest('cbs')
end

-- callback_head() when `changed`, else -2: nothing pending changed, the
-- index is left alone (no write for a job without a callback).
local function callback_note(changed)
  if not changed then
    return -2
  end
  return callback_head()
end

-- The account's earliest deadline of an unfinished job, or -1 (for the
-- index of accounts with deadlines, `{#jobs}:deadlines`).
local function deadline_head()
  return earliest('dl')
end
