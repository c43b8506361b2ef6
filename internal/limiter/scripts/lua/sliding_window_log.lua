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
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local TRIM = 64
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

local function reset_after()
  if newest_score == nil or newest_score <= cutoff then
    return 0
  end
  return math.max(newest_score + window - now, 1)
end

if cost > limit then
  return {0, math.max(limit - used, 0), -1, reset_after(), now_us, 0}
end
if used + cost > limit then
  -- Admission needs the running total at the window's start to reach total - (limit - cost):
  -- find by binary search over ranks (O(log^2 n)) the oldest member whose total is at least
  -- that; the request fits once it has left the window.
  local need = total - (limit - cost)
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
  local retry = math.max(tonumber(e[2]) + window - now, 1)
  return {0, math.max(limit - used, 0), retry, reset_after(), now_us, 0}
end

redis.call('ZADD', key, now, string.format('%017.0f', total + cost))
redis.call('PEXPIRE', key, window)
return {1, limit - used - cost, 0, window, now_us, cost}
