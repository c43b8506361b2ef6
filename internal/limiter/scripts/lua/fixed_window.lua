-- Fixed window counter, with leases and shares.
-- KEYS[1] window state: a hash with fields s (current window start, ms), c (its count) and p (the
-- previous window's count), shared with SlidingWindowCounter (see below), and one field per
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
-- restore their shares, in which case only this replica's share was; restored is what the shares added.
--
-- Windows are aligned to multiples of the window on Redis's clock, so every replica agrees on
-- where a window starts. FixedWindow decides on c alone; it keeps s, c and p exactly as
-- SlidingWindowCounter does, so that a rule whose algorithm changes between the two (or whose
-- replicas run both while a reload reaches them) counts one window, not two. The hash lives
-- until the end of the next window, when p stops mattering; its TTL is set by the same script
-- that starts a window in it.
--
-- A lease: when the cost fits, up to ARGV[5] units are granted (never more than fit) and
-- counted at once, so every unit a replica later admits from its lease was counted here first
-- and the window can never admit more than its limit. The lease ends with this window.
--
-- A hold (see internal/limiter/hold.go): ARGV[13] its tag (<replica id>:<seq>), ARGV[14] how
-- long it may stay open (ms), ARGV[15] the most holds of the key open at once (64 when absent),
-- KEYS[2] the state's hold records (see hold_sweep.lua, included below). A grant then records
-- itself there, deadline now + ttl (at most a window: its units end with their window, but it
-- counts among the key's open holds until then), and the reply carries that deadline
-- (ms) as an eighth integer; expired records are swept first. A key with ARGV[15] holds open
-- (records before their deadline) is refused, retry after the soonest of their deadlines or a
-- second, whichever is sooner (a settle frees one at any time): what its requests may spend
-- beyond their holds is then bounded by that many requests. A plain decision passes none of
-- them and pays for none of it.
--
-- Debt: a settle that used more than its hold counts the excess past the limit; the next window
-- starts with what c held beyond the limit (carry), at most one limit: a debt refuses the key
-- for the rest of its window and at most the whole next one, which is as long as the state
-- lives (the window's end and the next). More is counted in the metrics, not in the window.
--
-- The deadline: a call that reaches Redis after the caller stopped waiting for it (Redis paused,
-- a slow network) would count units nobody admits; it counts nothing instead.
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
  return redis.error_reply('ERR fixed window: window must be a whole number of ms from 1 to 1e15')
end
if htag and (not hk or #htag > 100 or not httl or not (httl >= 1 and httl <= 1e15) or httl ~= math.floor(httl)
    or not (cost >= 1 and cost <= 1e15) or cost ~= math.floor(cost) or not (want <= 1e15) or want ~= math.floor(want)
    or not (hmax >= 1 and hmax <= 1e6) or hmax ~= math.floor(hmax)) then
  return redis.error_reply('ERR fixed window: a hold needs KEYS[2], a tag of 100 bytes at most, whole ttl, cost and want from 1 to 1e15, and a whole bound of open holds from 1 to 1e6')
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local elapsed = now % window
local start = now - elapsed
local reset = window - elapsed

if deadline > 0 and now_us > deadline then
  return {0, 0, -2, reset, now_us, 0, 0}
end

local id, ms, m1, m2 = ARGV[6] or '', tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0
local hold_ms, peers_seen = tonumber(ARGV[10]) or 0, tonumber(ARGV[11]) or 0
local lv = tonumber(ARGV[12]) or 0
if htag then
--!include hold_sweep.lua
end
--!include shares_open.lua
if kind == 2 and prev > limit then
  -- A debt: the new window starts with what the last one counted past the limit, at most one
  -- limit (refused through this window; the state lives no longer).
  carry = math.min(prev - limit, limit)
  cur = cur + carry
end

local add = 0
if not held and cost > 0 and cost <= limit and cur + cost <= limit then
  add = math.min(want, limit - cur)
end
local hb_now = now
--!include hold_bound.lua
--!include shares_close.lua
local r
if held and cost <= limit then
  r = {0, math.max(limit - cur, 0), -3, reset, now_us, 0, restored}
elseif cost == 0 then
  r = {1, math.max(limit - cur, 0), 0, reset, now_us, 0, restored}
elseif cost > limit then
  r = {0, math.max(limit - cur, 0), -1, reset, now_us, 0, restored}
elseif hb_retry > 0 then
  r = {0, math.max(limit - cur, 0), hb_retry, reset, now_us, 0, restored}
elseif add == 0 then
  local retry = reset
  if hb_open > 0 then
    retry = math.min(retry, 1000) -- a settle may give units back (hold_bound.lua)
  end
  r = {0, math.max(limit - cur, 0), retry, reset, now_us, 0, restored}
else
  r = {1, limit - cur - add, 0, reset, now_us, add, restored}
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
