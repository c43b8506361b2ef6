-- Token bucket as GCRA (generic cell rate algorithm): one key holds the theoretical arrival time
-- (TAT, microseconds on Redis's clock) of the next request.
-- KEYS[1] TAT key. ARGV[1] requests per window, ARGV[2] window (ms), ARGV[3] cost,
-- ARGV[4] deadline (us on Redis's clock, 0 for none), ARGV[5] burst (bucket capacity).
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}; retry_after_ms
-- is -1 when the cost can never fit in the bucket, and -2 when the call ran after its deadline
-- (its caller stopped waiting), in which case nothing was taken.
--
-- One token drips in every window/limit; the bucket holds at most burst tokens. The key expires
-- when the bucket is full again, which is when it carries no information. Arithmetic is done
-- relative to now: absolute microsecond timestamps are too large for exact float subtraction.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local burst = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if deadline > 0 and now > deadline then
  return {0, 0, -2, 0, now, 0}
end

local interval = window * 1000 / limit -- microseconds per token
local tolerance = interval * burst     -- how far TAT may run ahead of now
local eps = 1e-6

-- ahead: how far the stored TAT is in the future, in microseconds (0 for an empty bucket).
local ahead = 0
-- GETRANGE of the first 32 bytes, not GET: the TAT is 17 digits or so, and the key is the
-- tenant's own, which it may have SET to a value of hundreds of MB that GET would copy into
-- Lua (and tonumber scan) on every call. Whatever the key holds, this reads 32 bytes.
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
end

local new_ahead = ahead + interval * cost
if new_ahead > tolerance + eps then
  return {0, tokens(ahead), math.max(ms(new_ahead - tolerance), 1), ms(ahead), now, 0}
end

local reset = math.max(ms(new_ahead), 1)
redis.call('SET', key, string.format('%.0f', now + math.ceil(new_ahead)), 'PX', reset)
return {1, tokens(new_ahead), 0, reset, now, cost}
