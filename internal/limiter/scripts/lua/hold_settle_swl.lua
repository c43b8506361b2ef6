-- Settles a hold of SlidingWindowLog (see internal/limiter/hold.go and sliding_window_log.lua)
-- with what its request used.
-- KEYS[1] the log, KEYS[2] its hold records, KEYS[3] held (hold_sweep_swl.lua).
-- ARGV[1] limit, ARGV[2] window (ms), ARGV[3] the hold's record (0:<units>:<tag>), ARGV[4]
-- units used, ARGV[5] the hold's deadline (ms on Redis's clock, as its grant said).
-- Returns {returned, debt, expired, 0, now_us, debt}.
--
-- A hold of the log is in held, not in the log. The record decides, removed first:
--   - present: its units leave held (never below 0), and what the request used is appended;
--   - absent before its deadline: a failover lost the reserve (the log keeps no shares to
--     restore it), so held never counted it here and keeps what it holds; used is appended;
--   - absent past its deadline: its holder was taken for dead and the sweep moved its units
--     from held into the log, spent (hold_sweep_swl.lua): only what the request used beyond
--     them is appended (expired), and nothing goes back, which under-admits by the unused
--     part for a window at most.
-- What is appended is ONE member, at now (running total + it), past the limit if need be: a
-- debt, refused until it leaves the window. So a hold's use counts from its reserve (held) to a
-- window after its settle (the log), never less: later than at its reserve, which keeps it
-- counted longer and under-admits, never over.
-- The debt is reported in full (used is at most 2^50); the log appends at most the hold plus
-- one limit of it, which refuses the key until it leaves the window as any larger member
-- would, and keeps the running totals below 2^53. A record of 0 units is a charge without a
-- hold: used counts in full. Every ARGV, and the log's newest member (the tenant's bytes), is
-- checked before anything is written; the sweep runs after the record is removed, so it never
-- takes the hold being settled. The log is trimmed as sliding_window_log.lua trims it, at most
-- TRIM a call, so settles add no backlog.
local key, hk, heldk = KEYS[1], KEYS[2], KEYS[3]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local member, used, hdl = ARGV[3] or '', tonumber(ARGV[4]), tonumber(ARGV[5])
local TRIM = 64
local function whole(x, lo, hi)
  return x and x >= lo and x <= hi and x == math.floor(x)
end
if not (hk and heldk and whole(limit, 1, 1e15) and whole(window, 1, 1e15) and whole(used, 0, 2^50) and whole(hdl, 0, 1e16)) then
  return redis.error_reply('ERR hold settle: KEYS[2] and KEYS[3], and whole limit and window from 1 to 1e15, used from 0 to 2^50 and deadline from 0 to 1e16')
end
local units = #member <= 160 and tonumber(string.match(member, '^0:(%d+):.*:[^:]+$'))
if not whole(units, 0, 1e15) then
  return redis.error_reply('ERR hold settle: the record must read 0:<units>:<tag>, 160 bytes at most')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)

-- The newest member names the running total the appended one continues. A log this script
-- and sliding_window_log.lua wrote names it by a whole number below 2^53 (exact in a double).
-- A log of the tenant's bytes (total false) appends nothing the sweep took off held.
local total = 0
local newest = redis.call('ZRANGE', key, -1, -1)
if newest[1] ~= nil then
  total = #newest[1] <= 32 and tonumber(newest[1])
  if not whole(total, 0, 9e15) then
    if used > 0 then
      return redis.error_reply('ERR hold settle: the log\'s newest member is not a running total')
    end
    total = false
  end
end

local present = redis.call('ZSCORE', hk, member)
if present then
  redis.call('ZREM', hk, member)
end
local held, swept, spent = tonumber(redis.call('GETRANGE', heldk, 0, 31)) or 0, false, 0
if not (held >= 0 and held <= 1e15) then
  held = 0 -- not a count this wrote: the tenant's own bytes, read as none held
end
held = math.floor(held)
--!include hold_sweep_swl.lua

local returned, debt, expired, logged = 0, math.max(used - units, 0), 0, used
if present or now < hdl then
  local back = units
  if present then
    back = math.min(units, held)
    held, swept = held - back, true
  end
  returned = math.max(back - used, 0)
else
  expired, logged = 1, debt
end
if swept then
  redis.call('SET', heldk, string.format('%.0f', held), 'PX', window)
end

logged = math.min(logged, units + limit)
if total then
  logged = logged + spent
end
if logged > 0 then
  local cutoff = now - window
  local old = redis.call('ZCOUNT', key, '-inf', cutoff)
  if old > 1 then
    -- As sliding_window_log.lua: the newest expired member stays, the anchor of its count.
    redis.call('ZREM', key, unpack(redis.call('ZRANGE', key, 0, math.min(old - 1, TRIM) - 1)))
  end
  redis.call('ZADD', key, now, string.format('%017.0f', total + logged))
  redis.call('PEXPIRE', key, window)
end
return {returned, debt, expired, 0, now_us, debt}
