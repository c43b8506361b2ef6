-- Returns the unused units of a lease to the window they were counted in.
-- KEYS[1] the limit's window state (the hash FixedWindow and SlidingWindowCounter share).
-- ARGV[1] window (ms), ARGV[2] the window's start (ms on Redis's clock, as the grant said),
-- ARGV[3] units.
-- Returns the units given back: 0 when that window has ended (its units ended with it).
local key = KEYS[1]
local window = tonumber(ARGV[1])
local start = tonumber(ARGV[2])
local units = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - (now % window) ~= start or units <= 0 then
  return 0
end
if redis.call('TYPE', key)['ok'] ~= 'hash' or tonumber(redis.call('HGET', key, 's')) ~= start then
  return 0
end
local n = math.min(units, tonumber(redis.call('HGET', key, 'c')) or 0)
if n > 0 then
  redis.call('HINCRBY', key, 'c', -n)
end
return n
