-- Returns the unused units of a lease to the window they were counted in.
-- KEYS[1] the limit's window state (the hash FixedWindow and SlidingWindowCounter share, with
-- the replicas' shares: see shares_open.lua, included below).
-- ARGV[1] window (ms), ARGV[2] the window's start (ms on Redis's clock, as the grant said),
-- ARGV[3] units, ARGV[4] the replica's id ('' keeps no share), ARGV[5] the start of the window
-- ARGV[6] is the replica's known share of (units returned included), ARGV[7] its share of the
-- window before, ARGV[8] its count of lowerings when it read them, its own lowering for this
-- return included, which a return that gives units back writes as ~<id> (see shares_open.lua).
-- Returns {returned, restored}: returned is 0 when that window has ended (its units ended with
-- it). A replica gives back only what this Redis holds of its share, once restored: units leased
-- from a master that is gone, and never counted here, are never taken off a count here.
local key = KEYS[1]
local window = tonumber(ARGV[1])
local start = tonumber(ARGV[2])
local units = tonumber(ARGV[3])
local id = ARGV[4] or ''

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - (now % window) ~= start or units <= 0 then
  return {0, 0}
end
if redis.call('TYPE', key)['ok'] ~= 'hash' then
  return {0, 0}
end
local ms, m1, m2 = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or 0
local lv = tonumber(ARGV[8]) or 0
local hold_ms, peers_seen, cost = 0, 0, 0 -- a return starts no hold, and only counts in one
--!include shares_open.lua
if kind ~= 1 then
  -- This Redis holds no count of the window: nothing of the lease is here to give back.
  return {0, 0}
end
local n = math.min(units, cur)
if id ~= '' then
  n = math.min(n, mine)
end
local add = -n
--!include shares_close.lua
-- The replica lowered its share before this call (see lease.go): a decision that read the share
-- before then, and runs after this, must not take the units that went back for a loss.
if n > 0 and id ~= '' and lv > 0 and lv <= 1e15 and lv == math.floor(lv) and (tonumber(h[5]) or 0) < lv then
  redis.call('HSET', key, '~' .. id, lv)
end
return {n, restored}
