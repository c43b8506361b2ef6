-- Dry run of sliding_window_log.lua: what a plain decision of cost units would answer now,
-- counting nothing. It trims nothing either: the members the decision would trim are all older
-- than the newest expired one, which both read as the base of the window's running total, so
-- the answer is the same; and the work stays O(log^2 n) whatever the log holds (a binary search
-- over ranks, no walk).
-- KEYS[1] and ARGV[1]-ARGV[4] are sliding_window_log.lua's (limit, window ms, cost, deadline
-- us). Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
if not window or window < 1 or window > 1e15 or window ~= math.floor(window) then
  return redis.error_reply('ERR sliding window log: window must be a whole number of ms from 1 to 1e15')
end
if not limit or not cost then
  return redis.error_reply('ERR sliding window log: limit and cost must be numbers')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if deadline > 0 and now_us > deadline then
  return {0, 0, -2, 0, now_us, 0}
end
local cutoff = now - window

local expired = redis.call('ZCOUNT', key, '-inf', cutoff)
local base, total, newest_score = 0, 0, nil
if expired > 0 then
  base = tonumber(redis.call('ZRANGE', key, expired - 1, expired - 1)[1]) or 0
end
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[1] ~= nil then
  total = tonumber(newest[1]) or 0
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
elseif used + cost <= limit then
  return {1, limit - used - cost, 0, window, now_us, cost}
end
-- The retry-after of sliding_window_log.lua's refusal: the oldest member whose running total
-- reaches total - (limit - cost) must leave the window.
local need = total - (limit - cost)
local lo, hi = expired, size - 1
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  if (tonumber(redis.call('ZRANGE', key, mid, mid)[1]) or 0) >= need then
    hi = mid
  else
    lo = mid + 1
  end
end
local e = redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')
local retry = window
if e[2] ~= nil then
  retry = math.max(tonumber(e[2]) + window - now, 1)
end
return {0, math.max(limit - used, 0), retry, reset_after(), now_us, 0}
