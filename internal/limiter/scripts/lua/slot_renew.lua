-- Slots, renewing a replica's: every slot of one key (KEYS[1]) its holder still holds gets a new
-- expiry, ttl from now on Redis's clock. A slot Redis no longer counts (missing: a failover to
-- a replica that had not received it, a restart, a flush; or past its expiry on this node's
-- clock) is re-asserted when the key has room for it, fewer than n live slots, as a share
-- restores counts: its holder's request is still running. Without room another request holds
-- its place now (re-adding it would make n + 1): it is taken off and reported lost, and its
-- holder ends or stops counting its request.
--
-- Bounded: at most 512 ids a call (the caller sends more in several calls), each one ZSCORE,
-- O(1), and one ZADD or ZREM, O(log n); one ZCOUNT, O(log n).
-- In: KEYS[1] the slots' zset; ARGV ttl (ms, 1..600000), n (1..1000000), then the ids.
-- Out: {re-asserted count, then the ids lost}.
local function bounded(v, lo, hi)
  v = tonumber(v)
  if not v or v ~= v then
    return lo
  end
  return math.floor(math.max(math.min(v, hi), lo))
end
local k = KEYS[1]
local ttl = bounded(ARGV[1], 1, 600000)
local n = bounded(ARGV[2], 1, 1000000)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', k, string.format('(%d', now), '+inf')
local out = {0}
local last = math.min(#ARGV, 514)
for i = 3, last do
  local id = ARGV[i]
  local s = tonumber(redis.call('ZSCORE', k, id))
  if s and s > now then
    redis.call('ZADD', k, 'XX', now + ttl, id)
  elseif live < n then
    redis.call('ZADD', k, now + ttl, id)
    live = live + 1
    out[1] = out[1] + 1
  else
    if s then
      redis.call('ZREM', k, id)
    end
    out[#out + 1] = id
  end
end
if #out - 1 < last - 2 then
  -- As lua/slot_acquire.lua: the key outlives its latest member, at most 10 minutes on.
  local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  local keep = ttl
  if top[2] and tonumber(top[2]) then
    keep = math.max(keep, math.min(math.floor(tonumber(top[2]) - now), 600000))
  end
  redis.call('PEXPIRE', k, keep)
end
return out
