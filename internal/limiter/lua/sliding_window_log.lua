-- Sliding window log: one sorted-set member per admitted unit of cost, scored by admission time.
-- KEYS[1] log key. ARGV[1] limit, ARGV[2] window (ms), ARGV[3] cost.
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms}; retry_after_ms is -1 when the
-- cost can never fit in the limit.
--
-- Exact over any window-long interval, at the price of memory proportional to the limit.
-- Members are "<now_us>:<n>" where n continues from the set's size, which cannot shrink while the
-- clock stands still, so members stay unique even for two calls in the same microsecond.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)

-- Entries admitted at or before now-window have left the window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)

local function reset_after()
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] == nil then
    return 0
  end
  return math.max(tonumber(newest[2]) + window - now, 1)
end

if cost > limit then
  return {0, math.max(limit - count, 0), -1, reset_after()}
end
if count + cost > limit then
  -- Admission needs count+cost-limit of the oldest entries gone; the last of them decides.
  local idx = count + cost - limit - 1
  local e = redis.call('ZRANGE', key, idx, idx, 'WITHSCORES')
  local retry = math.max(tonumber(e[2]) + window - now, 1)
  return {0, math.max(limit - count, 0), retry, reset_after()}
end

local prefix = string.format('%.0f:', now_us)
local args = {}
local added = 0
while added < cost do
  args[#args + 1] = now
  args[#args + 1] = prefix .. (count + added)
  added = added + 1
  -- Bound the argument count of one ZADD (Lua's C stack limits unpack).
  if #args >= 2000 or added == cost then
    redis.call('ZADD', key, unpack(args))
    args = {}
  end
end
redis.call('PEXPIRE', key, window)
return {1, limit - count - cost, 0, window}
