-- Slots, taking one: at most n requests of a key in progress at once, over every replica. A slot
-- is a member of the key's zset (KEYS[1]) named by its holder's id, scored by its expiry on
-- Redis's clock. Its holder renews it while its request runs (lua/slot_renew.lua) and takes it
-- off with ZREM when the request ends; a member whose expiry passed is a slot of a dead holder:
-- it no longer counts, and this script sweeps a few of them.
--
-- Bounded whatever the key holds (it is the tenant's own key: members it writes count against
-- its own key only): a sweep of at most 16 expired members (ZRANGEBYSCORE ... LIMIT, ZREM), one
-- ZCOUNT of the live ones, O(log n), and at most one ZADD.
-- In: KEYS[1] the slots' zset; ARGV id, n (1..cap), ttl (ms, 1..600000), cap.
-- Out: {taken (1/0), live slots after the call, expiry (ms on Redis's clock)}.
-- A number that is not one (nan, or missing) takes the least: these are the caller's own.
local function bounded(v, lo, hi)
  v = tonumber(v)
  if not v or v ~= v then
    return lo
  end
  return math.floor(math.max(math.min(v, hi), lo))
end
local k = KEYS[1]
local id = ARGV[1] or ''
local cap = bounded(ARGV[4], 1, 1000000)
local n = bounded(ARGV[2], 1, cap)
local ttl = bounded(ARGV[3], 1, 600000)
if id == '' or string.len(id) > 128 then
  return redis.error_reply('slot id empty or too long')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', k, '-inf', now, 'LIMIT', 0, 16)
if #dead > 0 then
  redis.call('ZREM', k, unpack(dead))
end
local live = redis.call('ZCOUNT', k, string.format('(%d', now), '+inf')
if live >= n then
  return {0, live, 0}
end
redis.call('ZADD', k, now + ttl, id)
-- The key outlives its latest member (one ZRANGE of the last, O(log n)), whatever expiry the
-- other writers use (sidecars with another --in-flight-expiry), and never lives longer than
-- the longest expiry, 10 minutes, past this call.
local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
local keep = ttl
if top[2] and tonumber(top[2]) then
  keep = math.max(keep, math.min(math.floor(tonumber(top[2]) - now), 600000))
end
redis.call('PEXPIRE', k, keep)
return {1, live + 1, now + ttl}
