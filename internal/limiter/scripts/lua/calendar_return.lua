-- Gives units back to a calendar window's period (see calendar_window.lua): a request another
-- rule refused, a lease of one unit nobody used.
-- KEYS[1] the period's count, ARGV[1] units, ARGV[2] the period's end (ms on Redis's clock).
-- Shares (see calendar_shares_open.lua), when ARGV[3] (the replica's id) is not empty: KEYS[2]
-- the period's share hash, ARGV[4] the start of the period ARGV[5] is the replica's known share
-- of (what it knew before its own lowering for this return), ARGV[6] its count of lowerings,
-- that lowering included, which a return that gives units back writes as ~<id>.
-- Returns {returned, 0, 0, restored}: nothing once the period ended (its units ended with it),
-- and never more than the count holds, nor, with shares, than this Redis holds of the
-- replica's share once restored (units granted by a Redis that is gone, and never counted here,
-- are never taken off a count here).
local units, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (units and units >= 1 and units <= 1e15 and stop) then
  return redis.error_reply('ERR calendar return: units from 1 to 1e15 and the period end')
end
local id, ms, m1, lv = ARGV[3] or '', tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local skey = KEYS[2]
local function whole(v, lo, hi) return v and v >= lo and v <= hi and v == math.floor(v) end
if id ~= '' and not (skey and #id <= 100 and whole(ms, 0, 1e16) and whole(m1, 0, 1e15) and whole(lv, 1, 1e15)) then
  return redis.error_reply('ERR calendar return: KEYS[2], an id of 100 bytes at most, and whole start, share and stamp')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= stop then
  return {0, 0, 0, 0}
end
local cur = tonumber(redis.call('GETRANGE', KEYS[1], 0, 31)) or 0 -- as calendar_window.lua
local n = math.min(units, cur)
if id == '' then
  if n > 0 then
    redis.call('DECRBY', KEYS[1], n)
  end
  return {n, 0, 0, 0}
end
-- Restore first, then lower. The caller sends a known share of this period only (0 else).
local h = redis.call('HMGET', skey, id, '~' .. id)
local mine, restored = tonumber(h[1]) or 0, 0
if (tonumber(h[2]) or 0) <= lv and m1 > mine then
  restored = m1 - mine
  cur, mine = cur + restored, m1
end
n = math.min(units, cur, mine)
if n == 0 and restored == 0 then
  return {0, 0, 0, 0}
end
if n ~= restored then
  redis.call('INCRBY', KEYS[1], restored - n)
end
redis.call('PEXPIREAT', KEYS[1], stop)
if n > 0 then
  redis.call('HSET', skey, id, mine - n, '~' .. id, lv)
else
  redis.call('HSET', skey, id, mine)
end
redis.call('PEXPIREAT', skey, stop)
return {n, 0, 0, restored}
