-- Slots, renewing a replica's: every slot of one key (KEYS[1]) its holder still holds gets a new
-- expiry, ttl from now on Redis's clock. A slot whose expiry passed is not renewed: it stopped
-- counting at its expiry, and another request may hold its place now (renewing it would make
-- n + 1); it is taken off and reported lost, and its holder ends or stops counting its request.
--
-- Bounded: at most 512 ids a call (the caller sends more in several calls), each one ZSCORE,
-- O(1), and one ZADD XX or ZREM, O(log n).
-- In: KEYS[1] the slots' zset; ARGV ttl (ms, 1..600000), then the ids. Out: the ids lost.
local k = KEYS[1]
local ttl = tonumber(ARGV[1])
if not ttl or ttl ~= ttl then
  ttl = 1
end
ttl = math.floor(math.max(math.min(ttl, 600000), 1))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = {}
local last = math.min(#ARGV, 513)
for i = 2, last do
  local id = ARGV[i]
  local s = tonumber(redis.call('ZSCORE', k, id))
  if s and s > now then
    redis.call('ZADD', k, 'XX', now + ttl, id)
  else
    if s then
      redis.call('ZREM', k, id)
    end
    lost[#lost + 1] = id
  end
end
if #lost < last - 1 then
  -- As lua/slot_acquire.lua: the key outlives its latest member, at most 10 minutes on.
  local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  local keep = ttl
  if top[2] and tonumber(top[2]) then
    keep = math.max(keep, math.min(math.floor(tonumber(top[2]) - now), 600000))
  end
  redis.call('PEXPIRE', k, keep)
end
return lost
