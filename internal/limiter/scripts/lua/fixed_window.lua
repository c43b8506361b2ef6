-- Fixed window counter, with leases.
-- KEYS[1] counter key. ARGV[1] limit, ARGV[2] window (ms), ARGV[3] cost, ARGV[4] (optional)
-- the units wanted, at least cost: a lease.
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, granted, window_start_ms};
-- retry_after_ms is -1 when the cost can never fit in the limit.
--
-- Windows are aligned to multiples of the window on Redis's clock, so every replica agrees on
-- where a window starts. The counter key lives exactly until the end of its window: the TTL is
-- set by the same SET that creates the key, so no crash can leave a counter without one. A key
-- whose TTL is not positive (the last millisecond of a window, or a key someone wrote without a
-- TTL) is treated as empty and overwritten.
--
-- A lease: when the cost fits, up to ARGV[4] units are granted (never more than fit) and
-- counted at once, so every unit a replica later admits from its lease was counted here first
-- and the window can never admit more than its limit. The lease is good until the window ends.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local want = math.max(tonumber(ARGV[4]) or cost, cost)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local elapsed = now % window
local reset = window - elapsed

local used = 0
local ttl = redis.call('PTTL', key)
if ttl > 0 then
  used = tonumber(redis.call('GET', key)) or 0
end

if cost > limit then
  return {0, math.max(limit - used, 0), -1, reset, 0, now - elapsed}
end
if used + cost > limit then
  return {0, math.max(limit - used, 0), reset, reset, 0, now - elapsed}
end

local grant = math.min(want, limit - used)
if ttl > 0 then
  redis.call('INCRBY', key, grant)
else
  redis.call('SET', key, grant, 'PX', reset)
end
return {1, limit - used - grant, 0, reset, grant, now - elapsed}
