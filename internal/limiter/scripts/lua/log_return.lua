-- Gives back one member of a sliding window log (see sliding_window_log.lua) that a decision
-- added for a request another rule refused (see internal/limiter/giveback.go).
-- KEYS[1] the log. ARGV[1] window (ms), ARGV[2] the member's score (ms on Redis's clock: when
-- it was admitted, as its reply said), ARGV[3] its cost.
-- Returns {returned, now_us}: returned is the cost taken off the window, 0 when the member has
-- left the window (it no longer counts) or could not be found within the bounds below.
--
-- A member is named by the running total of cost up to it, so the window counts the newest
-- member's total less the anchor's. Which member of that score and cost goes does not matter:
-- the log is the multiset of (score, cost), and any one of them is the same to every later
-- decision. It is removed, and every later member is renamed to its total less the cost, so
-- the count of every window that held it falls by the cost and no other member's cost changes
-- (the names stay distinct and in order). A member's cost is its total less its predecessor's
-- (its total alone for the first member: the log counts from 0 then).
--
-- Bounded work whatever the log holds (it is the tenant's own key): at most SCAN members of
-- that score are looked at, and at most REWRITE later ones renamed; beyond either bound, or a
-- name that is not a running total, nothing is given back, which under-admits (the member
-- counts until it leaves the window), never over-admits.
local key = KEYS[1]
local window, at, units = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local SCAN, REWRITE = 64, 256
local function whole(x, lo, hi)
  return x and x >= lo and x <= hi and x == math.floor(x)
end
if not (whole(window, 1, 1e15) and whole(at, 0, 1e16) and whole(units, 1, 1e15)) then
  return redis.error_reply('ERR log return: whole window and cost from 1 to 1e15, and a score from 0 to 1e16')
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if at <= now - window then
  return {0, now_us}
end
-- r: the rank of the first member of that score, the count of those before it.
local r = redis.call('ZCOUNT', key, '-inf', '(' .. at)
local from = math.max(r - 1, 0)
local span = redis.call('ZRANGE', key, from, r + SCAN - 1, 'WITHSCORES')
local function total(name)
  local n = #name <= 32 and tonumber(name)
  if whole(n, 0, 9e15) then
    return n
  end
  return nil
end
local prev = 0
local i = 1
if r > 0 then
  prev = total(span[1])
  i = 3
end
local found = nil
if span[i] == nil or tonumber(span[i + 1]) ~= at then
  return {0, now_us}
end
while prev and span[i] ~= nil and tonumber(span[i + 1]) == at do
  local n = total(span[i])
  if not n then
    return {0, now_us}
  end
  if n - prev == units then
    found = i
    break
  end
  prev, i = n, i + 2
end
if not found then
  return {0, now_us}
end
local rank = from + (found - 1) / 2
local later = redis.call('ZCARD', key) - rank - 1
if later > REWRITE then
  return {0, now_us}
end
local rest = {}
if later > 0 then
  rest = redis.call('ZRANGE', key, rank + 1, -1, 'WITHSCORES')
  for j = 1, #rest, 2 do
    if not total(rest[j]) then
      return {0, now_us}
    end
  end
end
redis.call('ZREM', key, span[found])
for j = 1, #rest, 2 do
  redis.call('ZREM', key, rest[j])
  redis.call('ZADD', key, rest[j + 1], string.format('%017.0f', total(rest[j]) - units))
end
return {units, now_us}
