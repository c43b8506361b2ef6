-- Sliding window log: one sorted-set member per admitted request, whatever its cost.
-- KEYS[1] log key. ARGV[1] limit, ARGV[2] window (ms), ARGV[3] cost, ARGV[4] deadline (us on
-- Redis's clock, 0 for none).
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}; retry_after_ms
-- is -1 when the cost can never fit in the limit, and -2 when the call ran after its deadline
-- (its caller stopped waiting), in which case nothing was counted.
--
-- Exact over any window-long interval. A member is scored by its admission time (ms, Redis
-- clock) and named by the running total of cost admitted up to and including it, zero-padded so
-- that members with equal scores sort in admission order. The cost inside the window is then
-- the newest member's total minus the total of the newest member that has left the window, so
-- no call sums or loops over members: work is O(log n) in the members, and n is at most the
-- limit (each request costs at least 1) plus the expired members not yet trimmed.
--
-- The newest expired member is kept as the anchor of that subtraction; older expired ones are
-- trimmed, at most TRIM per call so that one call never frees a window's worth of members at
-- once. Each call adds at most one member and trims up to TRIM, so the backlog cannot grow, and
-- the key expires a window after the last admission.
--
-- A tenant may fill its own log with millions of members and call this with any ARGV; the work
-- stays O(log^2 n) whatever both say: TRIM is a constant, the search takes at most log2(n) + 1
-- steps whatever limit and cost are (NaN included: every comparison false moves lo up), and
-- nothing else walks the log.
--
-- A hold (see internal/limiter/hold.go): ARGV[5] the most units wanted (at least cost), ARGV[6]
-- its tag (<replica id>:<seq>), ARGV[7] how long it may stay open (ms, at most the window),
-- ARGV[8] the most holds of the key open at once (64 when absent; see hold_bound.lua), KEYS[2]
-- the hold records, KEYS[3] held, the units the open holds hold (see hold_sweep_swl.lua,
-- included below: a hold past its deadline moves from held into the log, spent). A hold is not written to the log: a member is named by
-- the running total, so units of it could not go back without rewriting every later member.
-- The window then counts the log's cost plus held; a grant is min(want, limit - that) when
-- cost fits, added to held and recorded in KEYS[2], deadline now + ttl, and the reply carries
-- that deadline (ms) as a seventh integer; expired holds are swept first. Its settle
-- (hold_settle_swl.lua) takes its units off held and appends what the request used to the log,
-- at the settle's time. A plain decision passes none of them, pays for none of it, and does not
-- see held: a rule whose cost comes from its response only reserves, settles and charges.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local TRIM = 64
local htag, httl, hk, heldk, hmax = ARGV[6], tonumber(ARGV[7]), KEYS[2], KEYS[3], tonumber(ARGV[8]) or 64
local want = cost
if htag then
  -- Only a hold pays for the check (and the closure).
  want = math.max(tonumber(ARGV[5]) or cost, cost)
  local function whole(x)
    return x and x >= 1 and x <= 1e15 and x == math.floor(x)
  end
  if not (hk and heldk and #htag <= 100 and whole(httl) and whole(cost) and whole(want) and whole(limit)
      and whole(hmax) and hmax <= 1e6) then
    return redis.error_reply('ERR sliding window log: a hold needs KEYS[2] and KEYS[3], a tag of 100 bytes at most, whole ttl, cost, want and limit from 1 to 1e15, and a whole bound of open holds from 1 to 1e6')
  end
end
-- The window is checked before anything is written: it sizes the key's TTL, and NaN, inf, 0 or
-- a negative one (any ARGV a tenant's user sends, see package redisacl) would have PEXPIRE fail
-- after the writes, leaving a key without a TTL, or delete the key at once, on Redis's thread.
if not window or window < 1 or window > 1e15 or window ~= math.floor(window) then
  return redis.error_reply('ERR sliding window log: window must be a whole number of ms from 1 to 1e15')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if deadline > 0 and now_us > deadline then
  return {0, 0, -2, 0, now_us, 0}
end
local cutoff = now - window -- members scored at or before cutoff have left the window

local expired = redis.call('ZCOUNT', key, '-inf', cutoff)
if expired > 1 then
  -- The TRIM oldest read and removed by name rather than ZREMRANGEBYRANK: the same O(log n +
  -- TRIM) here, but a tenant's user is granted every command a script calls, and
  -- ZREMRANGEBYRANK 0 -1 on a log stuffed with millions frees them all in one command.
  local n = math.min(expired - 1, TRIM)
  redis.call('ZREM', key, unpack(redis.call('ZRANGE', key, 0, n - 1)))
  expired = expired - n
end

-- base: running total when the window began; total: running total now.
local base, total, newest_score = 0, 0, nil
if expired > 0 then
  base = tonumber(redis.call('ZRANGE', key, expired - 1, expired - 1)[1])
end
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[1] ~= nil then
  total = tonumber(newest[1])
  newest_score = tonumber(newest[2])
else
  base = 0
end
local used = total - base
local size = redis.call('ZCARD', key)

-- held: what open holds hold, GETRANGE'd as token_bucket.lua reads its TAT (the key is the
-- tenant's own: a value that is not a count reads as none, which only admits its own requests).
local held, swept, spent = 0, false, 0
if htag then
  held = tonumber(redis.call('GETRANGE', heldk, 0, 31)) or 0
  if not (held >= 0 and held <= 1e15) then
    held = 0
  end
  held = math.floor(held)
--!include hold_sweep_swl.lua
end
if spent > 0 and total + spent <= 9e15 then
  -- Holds whose holders died: spent, appended to the log as one member at now, as a settle.
  total, used, newest_score = total + spent, used + spent, now
  redis.call('ZADD', key, now, string.format('%017.0f', total))
  redis.call('PEXPIRE', key, window)
  size = size + 1
end
local add, hb_now = 0, now
if htag and cost <= limit and used + held + cost <= limit then
  add = 1
end
--!include hold_bound.lua

local function reset_after()
  if newest_score == nil or newest_score <= cutoff then
    return 0
  end
  return math.max(newest_score + window - now, 1)
end

local r, grant = nil, 0
if cost > limit then
  r = {0, math.max(limit - used - held, 0), -1, reset_after(), now_us, 0}
elseif used + held + cost > limit then
  local retry
  if held + cost > limit then
    -- What the log holds leaving cannot make room: the soonest hold deadline can (a settle
    -- may come sooner). The record is the tenant's, so its score is bounded to the window.
    local e = redis.call('ZRANGE', hk, 0, 0, 'WITHSCORES')
    retry = window
    if e[2] ~= nil then
      retry = math.max(math.min(tonumber(e[2]) - now, window), 1)
    end
  else
    -- Admission needs the running total at the window's start to reach total - (limit - held
    -- - cost): find by binary search over ranks (O(log^2 n)) the oldest member whose total is
    -- at least that; the request fits once it has left the window.
    local need = total - (limit - held - cost)
    local lo, hi = expired, size - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if tonumber(redis.call('ZRANGE', key, mid, mid)[1]) >= need then
        hi = mid
      else
        lo = mid + 1
      end
    end
    local e = redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')
    retry = math.max(tonumber(e[2]) + window - now, 1)
  end
  if hb_open > 0 then
    retry = math.min(retry, 1000) -- a settle may give units back (hold_bound.lua)
  end
  r = {0, math.max(limit - used - held, 0), retry, reset_after(), now_us, 0}
elseif hb_retry > 0 then
  r = {0, math.max(limit - used - held, 0), hb_retry, reset_after(), now_us, 0}
elseif htag then
  grant = math.min(want, limit - used - held)
  held = held + grant
  r = {1, limit - used - held, 0, window, now_us, grant}
else
  redis.call('ZADD', key, now, string.format('%017.0f', total + cost))
  redis.call('PEXPIRE', key, window)
  return {1, limit - used - cost, 0, window, now_us, cost}
end
if htag then
  if grant > 0 or swept then
    redis.call('SET', heldk, string.format('%.0f', held), 'PX', window)
  end
  local hdl = 0
  if grant > 0 then
    hdl = now + math.min(httl, window)
    redis.call('ZADD', hk, hdl, string.format('0:%d:%s', grant, htag))
    redis.call('PEXPIRE', hk, window)
  end
  r[7] = hdl
end
return r
