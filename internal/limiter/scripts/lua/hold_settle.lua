-- Settles a hold of FixedWindow or SlidingWindowCounter (see internal/limiter/hold.go) with what
-- its request used: the unused part goes back, an excess counts past the limit as debt.
-- KEYS[1] the window state (see fixed_window.lua), KEYS[2] its hold records (hold_sweep.lua).
-- ARGV[1] limit, ARGV[2] window (ms), ARGV[3] the hold's record (<window start>:<units>:<tag>),
-- ARGV[4] units used, ARGV[5] the hold's deadline (ms on Redis's clock, as its grant said),
-- ARGV[6] 1 for FixedWindow (a new window carries the debt), ARGV[7] the replica's id ('' keeps
-- no share), ARGV[8] the start of the window ARGV[9] is the replica's known share of, ARGV[10]
-- its known share of the window before, ARGV[11] its count of lowerings when it read them,
-- this settle's among them (see shares_open.lua): a settle that gives units back stamps ~<id>
-- with it.
-- Returns {returned, debt, expired, restored, now_us, counted}.
--
-- The record decides, removed first. A hold stays counted until it is settled or its window
-- ends: past its deadline its holder was taken for dead and its units stayed spent (see
-- hold_sweep.lua), so a settle finds them counted whether the record is present or not:
--   - of the current window: used < units gives units - used back, at most what this Redis
--     holds of the count and of the replica's share (as lease_return.lua; a record a failover
--     lost was restored by the shares first); used > units counts the excess, past the limit
--     if need be (debt);
--   - of a window that has ended: its units ended with it and nothing goes back; the excess
--     counts in the current window.
-- expired says the record was absent past its deadline: the hold had been taken for its
-- holder's last word (informational: the charge is the same).
-- A record of 0 units is a charge without a hold (limiter.Charge, a leased hold's excess):
-- used counts in full.
--
-- The debt is what was used beyond the hold, in full (used is at most 2^50, so every sum here
-- is exact in a double: below 2^53); the window counts it up to a count of 2^40, which keeps a
-- replica's share exact in its field (share * 4096 + tag, below 2^53) and refuses the key for
-- the rest of the window as a full count would; counted says what it counted. A FixedWindow
-- carries at most one limit of it into the next window (fixed_window.lua). Every ARGV is
-- checked before anything is written; the sweep runs after the record is removed.
local key, hk = KEYS[1], KEYS[2]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local member, used, hdl = ARGV[3] or '', tonumber(ARGV[4]), tonumber(ARGV[5])
local fixed = ARGV[6] == '1'
local function whole(x, lo, hi)
  return x and x >= lo and x <= hi and x == math.floor(x)
end
if not (hk and whole(limit, 1, 1e15) and whole(window, 1, 1e15) and whole(used, 0, 2^50) and whole(hdl, 0, 1e16)) then
  return redis.error_reply('ERR hold settle: KEYS[2], and whole limit and window from 1 to 1e15, used from 0 to 2^50 and deadline from 0 to 1e16')
end
local hstart, units
if #member <= 160 then
  local a, b = string.match(member, '^(%d+):(%d+):.*:[^:]+$')
  hstart, units = tonumber(a), tonumber(b)
end
if not (whole(hstart, 0, 1e16) and whole(units, 0, 1e15)) or hstart % window ~= 0 then
  return redis.error_reply('ERR hold settle: the record must read <window start>:<units>:<tag>, 160 bytes at most')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local elapsed = now % window
local start = now - elapsed
if hstart > start then
  return redis.error_reply('ERR hold settle: the record names a window that has not begun')
end

local present = redis.call('ZSCORE', hk, member)
if present then
  redis.call('ZREM', hk, member)
end
local id, ms, m1, m2 = ARGV[7] or '', tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
local lv = tonumber(ARGV[11]) or 0
--!include hold_sweep.lua
local hold_ms, peers_seen, cost = 0, 0, 0 -- a settle starts no hold
--!include shares_open.lua
if fixed and kind == 2 and prev > limit then
  carry = math.min(prev - limit, limit) -- as fixed_window.lua: the new window carries the last one's debt
  cur = cur + carry
end

local add, returned, debt, expired = 0, 0, 0, 0
if not present and now >= hdl then
  expired = 1
end
if hstart == start and used < units then
  returned = math.min(units - used, cur)
  if id ~= '' then
    returned = math.min(returned, mine)
  end
  add = -returned
else
  debt = math.max(used - units, 0)
  add = math.min(debt, math.max(2^40 - cur, 0))
end
--!include shares_close.lua
if returned > 0 and id ~= '' and lv > 0 and lv <= 1e15 and lv == math.floor(lv) and (tonumber(h[5]) or 0) < lv then
  redis.call('HSET', key, '~' .. id, lv)
end
return {returned, debt, expired, restored, now_us, math.max(add, 0)}
