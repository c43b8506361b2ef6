-- Dry run of fixed_window.lua: what a plain decision of cost units would answer now, counting
-- nothing. It reads what the decision reads and writes nothing (no key is created, changed or
-- given a TTL), so any number of dry runs leave the state byte for byte as it was.
-- KEYS[1] and ARGV[1]-ARGV[4] are fixed_window.lua's (limit, window ms, cost, deadline us).
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}, as a plain
-- decision of exactly cost units (no lease) would; granted is the cost it would count.
-- retry_after_ms -1: the cost never fits; -2: the call ran after its deadline; -3: grants wait
-- while the replicas restore their shares (see shares_open.lua).
--
-- No share is restored (the caller passes none): after a Redis lost counts, until the replicas
-- re-assert their shares, a dry run may see more room than the next decision, which restores
-- them first.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
if not window or window < 1 or window > 1e15 or window ~= math.floor(window) then
  return redis.error_reply('ERR fixed window: window must be a whole number of ms from 1 to 1e15')
end
if not limit or not cost then
  return redis.error_reply('ERR fixed window: limit and cost must be numbers')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local elapsed = now % window
local start = now - elapsed
local reset = window - elapsed
if deadline > 0 and now_us > deadline then
  return {0, 0, -2, reset, now_us, 0}
end

local id, ms, m1, m2, hold_ms, peers_seen, lv = '', 0, 0, 0, 0, 0, 0
--!include shares_open.lua
if kind == 2 and prev > limit then
  cur = cur + math.min(prev - limit, limit) -- a debt, as fixed_window.lua carries it
end

local left = math.max(limit - cur, 0)
if held and cost <= limit then
  return {0, left, -3, reset, now_us, 0}
elseif cost > limit then
  return {0, left, -1, reset, now_us, 0}
elseif cost > 0 and cur + cost <= limit then
  return {1, limit - cur - cost, 0, reset, now_us, cost}
end
return {0, left, reset, reset, now_us, 0}
