-- Calendar window: a fixed window whose periods (a day, week or month in a time zone) the caller
-- computes, since Lua has no zone data; Redis's clock picks the period.
-- KEYS[1..3] the counts of three consecutive periods, each key naming its period's start: the
-- caller's previous, current and next around its estimate of Redis's clock.
-- ARGV[1] limit, ARGV[2] the longest a period may be (ms), ARGV[3] cost (0: only restore shares),
-- ARGV[4] deadline (us on Redis's clock, 0 for none), ARGV[5..8] the periods' boundaries (ms on
-- Redis's clock): KEYS[i] counts [ARGV[4+i], ARGV[5+i]).
-- Shares (see calendar_shares_open.lua), when ARGV[9] (the replica's id) is not empty: KEYS[4..6]
-- the share hashes of the three periods, ARGV[10] the start of the period ARGV[11] is the
-- replica's known share of, ARGV[12] unused, ARGV[13] how long (ms) grants wait once a share had
-- to be restored, ARGV[14] the most replicas of the limit the caller saw live lately, ARGV[15]
-- the replica's count of lowerings when it read its share.
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted, restored}, as
-- fixed_window.lua; retry_after_ms is -1 when the cost can never fit, -2 when the call ran after
-- its deadline, -3 while grants wait for the replicas to restore their shares (only this
-- replica's share was) and -4 when Redis's clock is in none of the three periods (the caller's
-- clock is far from Redis's): nothing was counted, and the caller asks again around now_us (-2
-- and -4 answer six integers).
--
-- Each period has a key of its own, a string counting what was admitted in it, which expires at
-- the period's end: no roll, no previous count, nothing to share between periods. Only admitted
-- units are counted (a refusal writes nothing but restored shares), so a limit raised
-- mid-period admits at once and one lowered below the count refuses only what comes next.
--!include calendar_open.lua
local sk, so = 3, 8
--!include calendar_shares_open.lua
local add = 0
if not held and cost > 0 and cost <= limit and cur + cost <= limit then
  add = cost
end
--!include calendar_shares_close.lua
if held and cost <= limit then
  return {0, left, -3, reset, now_us, 0, restored}
elseif cost > limit then
  return {0, left, -1, reset, now_us, 0, restored}
elseif cost == 0 then
  return {1, left, 0, reset, now_us, 0, restored}
elseif add == 0 then
  return {0, left, reset, reset, now_us, 0, restored}
end
return {1, left - cost, 0, reset, now_us, cost, restored}
