-- Dry run of token_bucket.lua: what a plain decision of cost tokens would answer now, taking
-- nothing. It reads the TAT as the decision reads it (32 bytes at most) and writes nothing.
-- KEYS[1] and ARGV[1]-ARGV[5] are token_bucket.lua's (requests per window, window ms, cost,
-- deadline us, burst). Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us,
-- granted}.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local burst = tonumber(ARGV[5])
if not (limit and window and cost and burst) then
  return redis.error_reply('ERR token bucket: limit, window, cost and burst must be numbers')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if deadline > 0 and now > deadline then
  return {0, 0, -2, 0, now, 0}
end

local interval = window * 1000 / limit
local tolerance = interval * burst
local eps = 1e-6
local ahead = 0
local stored = tonumber(redis.call('GETRANGE', key, 0, 31))
if stored ~= nil and stored > now then
  ahead = stored - now
end

local function ms(us)
  return math.ceil(us / 1000 - eps)
end

local function tokens(a)
  return math.max(math.floor((tolerance - a) / interval + eps), 0)
end

if cost > burst then
  return {0, tokens(ahead), -1, ms(ahead), now, 0}
elseif ahead + interval * cost > tolerance + eps then
  return {0, tokens(ahead), math.max(ms(ahead + interval * cost - tolerance), 1), ms(ahead), now, 0}
end
local new_ahead = ahead + interval * cost
return {1, tokens(new_ahead), 0, math.max(ms(new_ahead), 1), now, cost}
