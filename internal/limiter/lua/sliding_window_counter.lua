-- Fixed window counter. First version; see the limiter package for the full contract.
-- KEYS[1] counter key. ARGV[1] limit, ARGV[2] window in ms, ARGV[3] cost.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local start = now - (now % window)
local key = KEYS[1] .. ':' .. start
local current = tonumber(redis.call('GET', key) or '0')
local reset = start + window - now
if current + cost > limit then
  return {0, limit - current, reset, reset}
end
current = redis.call('INCRBY', key, cost)
redis.call('PEXPIRE', key, reset)
return {1, limit - current, 0, reset}
