-- Fragment of the calendar window's scripts (calendar_window.lua, peek_calendar_window.lua,
-- calendar_reserve.lua, calendar_settle.lua; included in place, see scripts.go): checks the
-- arguments they share, picks the period holding Redis's clock and answers a miss or a call past
-- its deadline, leaving whole, b, i, key, cur, left, reset, now and now_us to the script that
-- includes it.
local limit, span, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local b = {tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])}
local function whole(v, lo, hi) return v and v >= lo and v <= hi and v == math.floor(v) end
-- Checked before anything is written: the boundaries set the keys' expiry, and any ARGV is a
-- tenant's to send (see package redisacl).
if not (whole(limit, 1, 1e15) and whole(span, 1, 1e12) and whole(cost, 0, 1e15)) then
  return redis.error_reply('ERR calendar window: whole limit from 1 to 1e15, span from 1 to 1e12 and cost from 0 to 1e15')
end
for i = 1, 4 do
  if not whole(b[i], 0, 1e16) or (i > 1 and not (b[i] > b[i - 1] and b[i] - b[i - 1] <= span)) then
    return redis.error_reply('ERR calendar window: four increasing boundaries, periods of at most the span')
  end
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local i = 0
for j = 1, 3 do
  if now >= b[j] and now < b[j + 1] then
    i = j
  end
end
if i == 0 then
  return {0, 0, -4, 0, now_us, 0}
end
local reset = b[i + 1] - now
if deadline > 0 and now_us > deadline then
  return {0, 0, -2, reset, now_us, 0}
end
local key = KEYS[i]
-- GETRANGE, not GET: the key is the tenant's own, and one holding a 512 MB string would be
-- copied whole by GET on Redis's one thread. A count is at most 16 digits.
local cur = tonumber(redis.call('GETRANGE', key, 0, 31)) or 0
local left = math.max(limit - cur, 0)
