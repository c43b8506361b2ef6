-- Sliding window counter: the previous fixed window's count, weighted by how much of it still
-- overlaps the sliding window, plus the current window's count.
-- KEYS[1] window state: a hash with fields s (current window start, ms), c (its count) and p (the
-- previous window's count), shared with FixedWindow (see fixed_window.lua), and one field per
-- replica holding its share (see shares_open.lua, included below).
-- ARGV[1] limit, ARGV[2] window (ms), ARGV[3] cost (0: only restore shares), ARGV[4] deadline
-- (us on Redis's clock, 0 for none), ARGV[5] the units wanted, at least cost: a lease,
-- ARGV[6] the replica's id ('' keeps no share), ARGV[7] the start of the window ARGV[8] is the
-- replica's known share of, ARGV[9] its known share of the window before, ARGV[10] how long
-- (ms) grants in the state wait once a share had to be restored in it (0: they do not),
-- ARGV[11] the most replicas of the limit the caller saw live lately (0: unknown), once that
-- many re-asserted their shares in a hold it ends, ARGV[12] the replica's count of lowerings
-- of this key's share when it read it (0: none; see shares_open.lua).
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted, restored};
-- retry_after_ms is -1 when the cost can never fit in the limit, -2 when the call ran after
-- its deadline, in which case nothing was counted, and -3 while grants wait for the replicas to
-- restore their shares, in which case only this replica's share was; restored is what the shares added, to the
-- current window and to the previous one (which the sliding estimate weighs).
--
-- Both windows live in one hash so the script touches exactly one declared key. Windows are
-- aligned on Redis's clock. The hash lives until the end of the next window, when the current
-- count stops mattering.
--
-- A lease: when the cost fits, up to ARGV[5] units are granted (never more than the estimate
-- leaves room for) and counted in the current window at once. The lease ends with the current
-- window, so its units are admitted in the window they were counted in; admitted later, they
-- would weigh only as that window's decaying share.
--
-- A hold (see internal/limiter/hold.go): ARGV[13] its tag (<replica id>:<seq>), ARGV[14] how
-- long it may stay open (ms), ARGV[15] the most holds of the key open at once (64 when absent),
-- KEYS[2] the state's hold records (see hold_sweep.lua, included below). A grant then records
-- itself there, deadline now + ttl (at most a window; as fixed_window.lua), and the reply carries that
-- deadline (ms) as an eighth integer; expired records are swept first, and a key with ARGV[15]
-- holds open is refused (as fixed_window.lua). A plain decision passes none of them and pays for
-- none of it. A debt (a settle past its hold) counts past the limit in c, and the weighted
-- previous window repays it: a debt refuses the key for the rest of its window and, weighted,
-- for the next one (nearly all of it for a debt of many limits); the state lives no longer.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local want = math.max(tonumber(ARGV[5]) or cost, cost)
local htag, httl, hk, hmax = ARGV[13], tonumber(ARGV[14]), KEYS[2], tonumber(ARGV[15]) or 64
-- The window is checked before anything is written: it sizes the key's TTL, and NaN, inf, 0 or
-- a negative one (any ARGV a tenant's user sends, see package redisacl) would have PEXPIRE fail
-- after the writes, leaving a key without a TTL, or delete the key at once, on Redis's thread.
if not window or window < 1 or window > 1e15 or window ~= math.floor(window) then
  return redis.error_reply('ERR sliding window counter: window must be a whole number of ms from 1 to 1e15')
end
if htag and (not hk or #htag > 100 or not httl or not (httl >= 1 and httl <= 1e15) or httl ~= math.floor(httl)
    or not (cost >= 1 and cost <= 1e15) or cost ~= math.floor(cost) or not (want <= 1e15) or want ~= math.floor(want)
    or not (hmax >= 1 and hmax <= 1e6) or hmax ~= math.floor(hmax)) then
  return redis.error_reply('ERR sliding window counter: a hold needs KEYS[2], a tag of 100 bytes at most, whole ttl, cost and want from 1 to 1e15, and a whole bound of open holds from 1 to 1e6')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local elapsed = now % window
local start = now - elapsed

if deadline > 0 and now_us > deadline then
  return {0, 0, -2, 0, now_us, 0, 0}
end

local id, ms, m1, m2 = ARGV[6] or '', tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0
local hold_ms, peers_seen = tonumber(ARGV[10]) or 0, tonumber(ARGV[11]) or 0
local lv = tonumber(ARGV[12]) or 0
if htag then
--!include hold_sweep.lua
end
--!include shares_open.lua

local weight = (window - elapsed) / window
local estimate = prev * weight + cur

-- estimate + cost <= limit and cost is whole, so the room's floor is at least cost.
local add = 0
if not held and cost > 0 and cost <= limit and estimate + cost <= limit then
  add = math.min(want, math.floor(limit - estimate))
end
local hb_now = now
--!include hold_bound.lua
--!include shares_close.lua

-- Until the end of the next window while this one counted anything (the next inherits it).
local reset = window - elapsed
if cur + add > 0 then
  reset = 2 * window - elapsed
end
local remaining = math.max(math.floor(limit - estimate - add), 0)
local r
if held and cost <= limit then
  r = {0, remaining, -3, reset, now_us, 0, restored}
elseif cost == 0 then
  r = {1, remaining, 0, reset, now_us, 0, restored}
elseif cost > limit then
  r = {0, remaining, -1, reset, now_us, 0, restored}
elseif hb_retry > 0 then
  r = {0, remaining, hb_retry, reset, now_us, 0, restored}
elseif add == 0 then
  local retry
  local room = limit - cost - cur
  if room >= 0 and prev > 0 then
    -- Wait in this window until prev * (window - e) / window <= room.
    retry = math.ceil(window - room * window / prev) - elapsed
  else
    -- Wait for the next window, where cur becomes the weighted previous count.
    local need = 0
    if cur > 0 then
      need = math.ceil(window * (1 - (limit - cost) / cur))
    end
    retry = (window - elapsed) + math.max(need, 0)
  end
  if hb_open > 0 then
    retry = math.min(retry, 1000) -- a settle may give units back (hold_bound.lua)
  end
  r = {0, remaining, math.max(retry, 1), reset, now_us, 0, restored}
else
  r = {1, remaining, 0, reset, now_us, add, restored}
end
if htag then
  local hdl = 0
  if add > 0 then
    hdl = now + math.min(httl, window)
    redis.call('ZADD', hk, hdl, string.format('%d:%d:%s', start, add, htag))
    redis.call('PEXPIRE', hk, 2 * window - elapsed)
  end
  r[8] = hdl
end
return r
