-- Fixed window counter.
-- KEYS[1] counter key. ARGV[1] limit, ARGV[2] window (ms), ARGV[3] cost.
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms}; retry_after_ms is -1 when the
-- cost can never fit in the limit.
--
-- Windows are aligned to multiples of the window on Redis's clock, so every replica agrees on
-- where a window starts. The counter key lives exactly until the end of its window: the TTL is
-- set by the same SET that creates the key, so no crash can leave a counter without one. A key
-- whose TTL is not positive (the last millisecond of a window, or a key someone wrote without a
-- TTL) is treated as empty and overwritten.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reset = window - (now % window)

local used = 0
local ttl = redis.call('PTTL', key)
if ttl > 0 then
  used = tonumber(redis.call('GET', key)) or 0
end

if cost > limit then
  return {0, math.max(limit - used, 0), -1, reset}
end
if used + cost > limit then
  return {0, math.max(limit - used, 0), reset, reset}
end

if ttl > 0 then
  redis.call('INCRBY', key, cost)
else
  redis.call('SET', key, cost, 'PX', reset)
end
return {1, limit - used - cost, 0, reset}
