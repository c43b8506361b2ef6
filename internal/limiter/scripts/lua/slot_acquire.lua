-- Slots, taking one: at most n requests of a key in progress at once, over every replica. A slot
-- is a member of the key's zset (KEYS[1]) named by its holder's id, scored by its expiry on
-- Redis's clock. Its holder renews it while its request runs (lua/slot_renew.lua) and takes it
-- off with ZREM when the request ends; a member whose expiry passed is a slot of a dead holder:
-- it no longer counts, and this script sweeps a few of them.
--
-- The line: the requests that wait for a slot of the key take turns across replicas. Each
-- replica's oldest waiter of the key (its head; the others wait in their replica, in order) is
-- a member of the line (KEYS[2]) scored by its arrival (microseconds on Redis's clock) and of
-- its deadlines (KEYS[3]), scored by when it leaves the line unless it asks again: each of its
-- tries moves it wttl on, so the head of a replica that died or stalled leaves by itself. A
-- waiter is granted a slot only when the live slots and the waiters ahead of it leave room,
-- and leaves the line with it; refused, it joins (ZADD NX: its arrival stays) or stays. A try
-- without a waiter (a first try, a rule without a queue) is granted only when the live slots
-- and every live waiter leave room: it never passes a waiter of another replica. A waiter
-- counts ahead of it those that came before it, but no more than the other live waiters, so
-- that waiters past their deadline not swept yet hold up nobody.
--
-- Bounded whatever the keys hold (they are the tenant's own: members it writes count against
-- its own key only): sweeps of at most 16 expired members of the slots and 16 of the
-- deadlines (ZRANGEBYSCORE ... LIMIT, ZREM), three ZCOUNT and two ZSCORE, O(log n), one ZCARD, and at
-- most three ZADD and two ZREM of one member. A line of cap waiters takes no more: a waiter
-- that finds it full is decided as a try without one.
-- In: KEYS[1] the slots' zset, KEYS[2] the line, KEYS[3] its deadlines (without them, no line);
-- ARGV id, n (1..cap), ttl (ms, 1..600000), cap, waiter id ('' for none), wttl (ms, 1..600000).
-- Out: {taken (1/0), live slots after the call, expiry (ms on Redis's clock)}.
-- A number that is not one (nan, or missing) takes the least: these are the caller's own.
local function bounded(v, lo, hi)
  v = tonumber(v)
  if not v or v ~= v then
    return lo
  end
  return math.floor(math.max(math.min(v, hi), lo))
end
local k, line, due = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1] or ''
local cap = bounded(ARGV[4], 1, 1000000)
local n = bounded(ARGV[2], 1, cap)
local ttl = bounded(ARGV[3], 1, 600000)
local w = ARGV[5] or ''
local wttl = bounded(ARGV[6], 1, 600000)
if id == '' or string.len(id) > 128 then
  return redis.error_reply('slot id empty or too long')
end
if string.len(w) > 128 then
  return redis.error_reply('waiter id too long')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
local dead = redis.call('ZRANGEBYSCORE', k, '-inf', now, 'LIMIT', 0, 16)
if #dead > 0 then
  redis.call('ZREM', k, unpack(dead))
end
local live = redis.call('ZCOUNT', k, string.format('(%d', now), '+inf')
-- The line outlives its latest deadline, at most 10 minutes on.
local function keepLine()
  local top = redis.call('ZRANGE', due, -1, -1, 'WITHSCORES')
  local keep = wttl
  if top[2] and tonumber(top[2]) then
    keep = math.max(keep, math.min(math.floor(tonumber(top[2]) - now), 600000))
  end
  redis.call('PEXPIRE', line, keep)
  redis.call('PEXPIRE', due, keep)
end
local ahead = 0
local at = nil
if line and due then
  local gone = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 16)
  if #gone > 0 then
    redis.call('ZREM', due, unpack(gone))
    redis.call('ZREM', line, unpack(gone))
  end
  if w ~= '' then
    at = tonumber(redis.call('ZSCORE', line, w))
    if not at and redis.call('ZCARD', line) < cap then
      redis.call('ZADD', line, 'NX', arrival, w)
      at = arrival
    end
  end
  ahead = redis.call('ZCOUNT', due, string.format('(%d', now), '+inf')
  if at then
    -- Those that came before it, but no more than the other live waiters: a line stuffed
    -- with dead waiters not swept yet holds up nobody.
    local mine = tonumber(redis.call('ZSCORE', due, w))
    if mine and mine > now then
      ahead = ahead - 1
    end
    ahead = math.min(ahead, redis.call('ZCOUNT', line, '-inf', string.format('(%d', at)))
  end
end
if live + ahead >= n then
  if at then
    redis.call('ZADD', due, now + wttl, w)
    keepLine()
  end
  return {0, live, 0}
end
redis.call('ZADD', k, now + ttl, id)
if at then
  redis.call('ZREM', line, w)
  redis.call('ZREM', due, w)
end
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
