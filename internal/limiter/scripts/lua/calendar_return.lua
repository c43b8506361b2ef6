-- Gives units back to a calendar window's period (see calendar_window.lua): a request another
-- rule refused, a lease of one unit nobody used.
-- KEYS[1] the period's count, ARGV[1] units, ARGV[2] the period's end (ms on Redis's clock).
-- Returns {returned, 0}: nothing once the period ended (its units ended with it), and never
-- more than the count holds.
local units, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (units and units >= 1 and units <= 1e15 and stop) then
  return redis.error_reply('ERR calendar return: units from 1 to 1e15 and the period end')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= stop then
  return {0, 0}
end
local cur = tonumber(redis.call('GETRANGE', KEYS[1], 0, 31)) or 0 -- as calendar_window.lua
local n = math.min(units, cur)
if n > 0 then
  redis.call('DECRBY', KEYS[1], n)
end
return {n, 0}
