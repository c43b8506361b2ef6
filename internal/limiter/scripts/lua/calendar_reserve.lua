-- Calendar window, a hold (see internal/limiter/hold.go and calendar_hold.go): reserves between
-- the least and the most units of a request whose cost is known only after it, in the period
-- holding Redis's clock, as fixed_window.lua does for a window of fixed length.
-- KEYS[1..3] the periods' counts and ARGV[1..8] as calendar_window.lua (ARGV[3], the cost, is
-- the least the request needs); KEYS[4] the hold records (hold_sweep.lua), ARGV[9] the most
-- units wanted, ARGV[10] the hold's tag (<replica id>:<seq>), ARGV[11] how long it may stay open
-- (ms), ARGV[12] the most holds of the key open at once.
-- Shares (see calendar_shares_open.lua), when ARGV[13] (the replica's id) is not empty: KEYS[5..7]
-- the periods' share hashes and ARGV[13..19] as calendar_window.lua's ARGV[9..15].
-- Returns calendar_window.lua's reply and the hold's deadline (ms; 0 when nothing was granted)
-- as an eighth integer.
--
-- A grant counts min(want, what is left) in the period at once, like any grant, in the
-- replica's share of the period too (a failover restores held units like granted ones), and
-- records the hold as <period start>:<units>:<tag>, scored by its deadline: now + its ttl, at
-- most the longest period. The deadline may pass the period's end: the hold's units end with
-- their period, but its request may still run, and may still owe debt, so it counts among the
-- key's open holds until its deadline (hold_bound.lua), in whichever period that falls. The
-- records live a longest period after the last reserve, past every deadline.
--!include calendar_open.lua
local hk, want, htag, httl, hmax = KEYS[4], tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12])
if not (hk and htag and #htag <= 100 and whole(cost, 1, 1e15) and whole(want, cost, 1e15)
    and whole(httl, 1, 1e15) and whole(hmax, 1, 1e6)) then
  return redis.error_reply('ERR calendar reserve: KEYS[4], a tag of 100 bytes at most, whole cost, want (at least cost) and ttl from 1 to 1e15, and a whole bound of open holds from 1 to 1e6')
end
local sk, so = 4, 12
--!include calendar_shares_open.lua
--!include hold_sweep.lua
local add = 0
if not held and cost <= limit and cur + cost <= limit then
  add = math.min(want, limit - cur)
end
local hb_now = now
--!include hold_bound.lua
--!include calendar_shares_close.lua
if held and cost <= limit then
  return {0, left, -3, reset, now_us, 0, restored, 0}
elseif cost > limit then
  return {0, left, -1, reset, now_us, 0, restored, 0}
elseif hb_retry > 0 then
  return {0, left, hb_retry, reset, now_us, 0, restored, 0}
elseif add == 0 then
  local retry = reset
  if hb_open > 0 then
    retry = math.min(retry, 1000) -- a settle may give units back at any time (hold_bound.lua)
  end
  return {0, left, retry, reset, now_us, 0, restored, 0}
end
local hdl = now + math.min(httl, span)
redis.call('ZADD', hk, hdl, string.format('%d:%d:%s', b[i], add, htag))
redis.call('PEXPIRE', hk, span) -- past every record's deadline: each is at most a span after its reserve
return {1, left - add, 0, reset, now_us, add, restored, hdl}
