-- Dry run of sliding_window_counter.lua: what a plain decision of cost units would answer now,
-- counting nothing (see peek_fixed_window.lua: it writes nothing, restores no share).
-- KEYS[1] and ARGV[1]-ARGV[4] are sliding_window_counter.lua's (limit, window ms, cost,
-- deadline us). Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
if not window or window < 1 or window > 1e15 or window ~= math.floor(window) then
  return redis.error_reply('ERR sliding window counter: window must be a whole number of ms from 1 to 1e15')
end
if not limit or not cost then
  return redis.error_reply('ERR sliding window counter: limit and cost must be numbers')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local elapsed = now % window
local start = now - elapsed
if deadline > 0 and now_us > deadline then
  return {0, 0, -2, 0, now_us, 0}
end

local id, ms, m1, m2, hold_ms, peers_seen, lv = '', 0, 0, 0, 0, 0, 0
--!include shares_open.lua

local weight = (window - elapsed) / window
local estimate = prev * weight + cur
local add = 0
if not held and cost > 0 and cost <= limit and estimate + cost <= limit then
  add = cost
end
local reset = window - elapsed
if cur + add > 0 then
  reset = 2 * window - elapsed
end
local remaining = math.max(math.floor(limit - estimate - add), 0)
if held and cost <= limit then
  return {0, remaining, -3, reset, now_us, 0}
elseif cost > limit then
  return {0, remaining, -1, reset, now_us, 0}
elseif add > 0 then
  return {1, remaining, 0, reset, now_us, add}
end
-- The retry-after of sliding_window_counter.lua's refusal.
local retry
local room = limit - cost - cur
if room >= 0 and prev > 0 then
  retry = math.ceil(window - room * window / prev) - elapsed
else
  local need = 0
  if cur > 0 then
    need = math.ceil(window * (1 - (limit - cost) / cur))
  end
  retry = (window - elapsed) + math.max(need, 0)
end
return {0, remaining, math.max(retry, 1), reset, now_us, 0}
