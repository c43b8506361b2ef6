-- Gives back tokens a TokenBucket decision took for a request that another rule refused (see
-- internal/limiter/giveback.go): the TAT moves back by their drip time, never before now.
-- KEYS[1] the TAT key (see token_bucket.lua). ARGV[1] requests per window, ARGV[2] window (ms),
-- ARGV[3] burst, ARGV[4] units.
-- Returns {returned, now_us}: returned is how many tokens that freed (0 when the bucket had
-- refilled past them meanwhile: a full bucket holds no more).
--
-- Taking c tokens moved the TAT on by c * interval; moving it back by as much undoes exactly
-- that, whatever others took in between (they moved it on by their own). A TAT this script
-- cannot have written (the tenant's own bytes, or past the furthest a debt runs it) is left as
-- it is. Every ARGV is checked before anything is written.
local key = KEYS[1]
local limit, window, burst, units = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function whole(x)
  return x and x >= 1 and x <= 1e15 and x == math.floor(x)
end
if not (whole(limit) and whole(window) and whole(burst) and whole(units)) then
  return redis.error_reply('ERR token return: whole limit, window, burst and units from 1 to 1e15')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = window * 1000 / limit
local eps = 1e-6
local stored = tonumber(redis.call('GETRANGE', key, 0, 31))
if stored == nil or stored <= now then
  return {0, now}
end
local ahead = stored - now
if ahead > interval * burst + window * 1000 + 1 then
  return {0, now}
end
local returned = math.min(units, math.floor(ahead / interval + eps))
ahead = math.max(ahead - units * interval, 0)
redis.call('SET', key, string.format('%.0f', now + math.ceil(ahead)), 'PX', math.max(math.ceil(ahead / 1000 - eps), 1))
return {returned, now}
