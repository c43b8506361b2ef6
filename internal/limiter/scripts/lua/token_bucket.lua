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
--
-- A hold (see internal/limiter/hold.go): ARGV[6] the most tokens wanted (at least cost; the
-- grant is as many as the bucket holds, cost at least), ARGV[7] its tag (<replica id>:<seq>),
-- ARGV[8] how long it may stay open (ms, at most the window), KEYS[2] the hold records (see
-- hold_sweep_tb.lua, included below), ARGV[9] the most holds of the key open at once (64 when
-- absent). A grant then records itself there, deadline now + ttl, and the reply carries it (ms)
-- as a seventh integer; expired records are swept first, and a key with ARGV[9] holds open is
-- refused (see hold_bound.lua). A plain decision passes none of them and pays for none of it. A
-- debt (a settle past its hold) pushes the TAT past the tolerance, at most one window past it:
-- refused until the bucket has refilled it (hold_settle_tb.lua).
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local burst = tonumber(ARGV[5])
local want = math.max(tonumber(ARGV[6]) or cost, cost)
local htag, httl, hk, hmax = ARGV[7], tonumber(ARGV[8]), KEYS[2], tonumber(ARGV[9]) or 64
if htag then
  -- Only a hold pays for the check (and the closure).
  local function whole(x)
    return x and x >= 1 and x <= 1e15 and x == math.floor(x)
  end
  if not (hk and #htag <= 100 and whole(httl) and whole(cost) and whole(want) and whole(limit) and whole(window) and whole(burst)
      and whole(hmax) and hmax <= 1e6) then
    return redis.error_reply('ERR token bucket: a hold needs KEYS[2], a tag of 100 bytes at most, whole ttl, cost, want, limit, window and burst from 1 to 1e15, and a whole bound of open holds from 1 to 1e6')
  end
end

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
local now_ms = math.floor(now / 1000)
if htag then
  if ahead > tolerance + window * 1000 + 1 then
    ahead = tolerance -- not a TAT this wrote (see hold_settle_tb.lua)
  end
--!include hold_sweep_tb.lua
end

local function ms(us)
  return math.ceil(us / 1000 - eps)
end

local function tokens(a)
  return math.max(math.floor((tolerance - a) / interval + eps), 0)
end

-- The bound of open holds needs to know whether a grant is coming: add is 1 when it is.
local add, hb_now = 0, now_ms
if cost <= burst and ahead + interval * cost <= tolerance + eps then
  add = 1
end
--!include hold_bound.lua

local r, grant, new_ahead = nil, 0, ahead
if cost > burst then
  r = {0, tokens(ahead), -1, ms(ahead), now, 0}
elseif ahead + interval * cost > tolerance + eps then
  local retry = math.max(ms(ahead + interval * cost - tolerance), 1)
  if hb_open > 0 then
    retry = math.min(retry, 1000) -- a settle may give tokens back (hold_bound.lua)
  end
  r = {0, tokens(ahead), retry, ms(ahead), now, 0}
elseif hb_retry > 0 then
  r = {0, tokens(ahead), hb_retry, ms(ahead), now, 0}
else
  grant = cost
  if want > cost then
    grant = math.max(math.min(want, tokens(ahead)), cost)
  end
  new_ahead = ahead + interval * grant
  r = {1, tokens(new_ahead), 0, math.max(ms(new_ahead), 1), now, grant}
end
if grant > 0 then
  redis.call('SET', key, string.format('%.0f', now + math.ceil(new_ahead)), 'PX', math.max(ms(new_ahead), 1))
end
if htag then
  local hdl = 0
  if grant > 0 then
    hdl = now_ms + math.min(httl, window)
    redis.call('ZADD', hk, hdl, string.format('0:%d:%s', grant, htag))
    redis.call('PEXPIRE', hk, window)
  end
  r[7] = hdl
end
return r
