-- Settles a hold of TokenBucket (see internal/limiter/hold.go) with what its request used.
-- KEYS[1] the TAT key (see token_bucket.lua), KEYS[2] its hold records (hold_sweep_tb.lua).
-- ARGV[1] requests per window, ARGV[2] window (ms), ARGV[3] burst, ARGV[4] the hold's record
-- (0:<units>:<tag>), ARGV[5] units used, ARGV[6] the hold's deadline (ms on Redis's clock).
-- Returns {returned, debt, expired, 0, now_us, debt}.
--
-- A hold's tokens stay taken until it is settled: past its deadline its holder was taken for
-- dead and the sweep left them taken (hold_sweep_tb.lua), so present or not (expired says it
-- was absent past its deadline), used < units moves the TAT back by the unused tokens, never
-- before now (returned says how many that freed), and used > units moves it on by the excess,
-- past the tolerance if need be: the key is refused until it has refilled. A record of 0 units
-- is a charge without a hold: used counts in full. The debt is reported in full (used is at
-- most 2^50); the TAT runs at most one window past the tolerance, so a debt refuses the key
-- for at most a window more than an empty bucket would, and the key never outlives that. Every
-- ARGV is checked before anything is written.
local key, hk = KEYS[1], KEYS[2]
local limit, window, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, used, hdl = ARGV[4] or '', tonumber(ARGV[5]), tonumber(ARGV[6])
local function whole(x, lo, hi)
  return x and x >= lo and x <= hi and x == math.floor(x)
end
if not (hk and whole(limit, 1, 1e15) and whole(window, 1, 1e15) and whole(burst, 1, 1e15)
    and whole(used, 0, 2^50) and whole(hdl, 0, 1e16)) then
  return redis.error_reply('ERR hold settle: KEYS[2], and whole limit, window and burst from 1 to 1e15, used from 0 to 2^50 and deadline from 0 to 1e16')
end
local units = #member <= 160 and tonumber(string.match(member, '^0:(%d+):.*:[^:]+$'))
if not whole(units, 0, 1e15) then
  return redis.error_reply('ERR hold settle: the record must read 0:<units>:<tag>, 160 bytes at most')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local interval = window * 1000 / limit
local eps = 1e-6

local present = redis.call('ZSCORE', hk, member)
if present then
  redis.call('ZREM', hk, member)
end
local ahead = 0
local stored = tonumber(redis.call('GETRANGE', key, 0, 31))
if stored ~= nil and stored > now then
  ahead = stored - now
end
local tolerance = interval * burst
local most = tolerance + window * 1000 -- the furthest a debt runs the TAT ahead
if ahead > most + 1 then
  -- Past the most a debt writes: not a TAT this wrote, but the tenant's own bytes, read as an
  -- empty bucket rather than written back with a TTL Redis refuses.
  ahead = tolerance
end
--!include hold_sweep_tb.lua

local returned, debt, expired = 0, 0, 0
if not present and now_ms >= hdl then
  expired = 1
end
if used < units then
  returned = math.min(units - used, math.floor(ahead / interval + eps))
  ahead = math.max(ahead - (units - used) * interval, 0)
else
  debt = used - units
  ahead = math.min(ahead + debt * interval, math.max(most, ahead))
end
if returned > 0 or debt > 0 then
  redis.call('SET', key, string.format('%.0f', now + math.ceil(ahead)), 'PX', math.max(math.ceil(ahead / 1000 - eps), 1))
end
return {returned, debt, expired, 0, now, debt}
