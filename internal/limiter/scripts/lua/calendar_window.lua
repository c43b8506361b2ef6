-- Calendar window: a fixed window whose periods (a day, week or month in a time zone) the caller
-- computes, since Lua has no zone data; Redis's clock picks the period.
-- KEYS[1..3] the counts of three consecutive periods, each key naming its period's start: the
-- caller's previous, current and next around its estimate of Redis's clock.
-- ARGV[1] limit, ARGV[2] the longest a period may be (ms), ARGV[3] cost, ARGV[4] deadline (us on
-- Redis's clock, 0 for none), ARGV[5..8] the periods' boundaries (ms on Redis's clock): KEYS[i]
-- counts [ARGV[4+i], ARGV[5+i]).
-- Returns {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted}, as
-- fixed_window.lua; retry_after_ms is -1 when the cost can never fit, -2 when the call ran after
-- its deadline and -4 when Redis's clock is in none of the three periods (the caller's clock is
-- far from Redis's): nothing was counted, and the caller asks again around now_us.
--
-- Each period has a key of its own, a string counting what was admitted in it, which expires at
-- the period's end: no roll, no previous count, nothing to share between periods. Only admitted
-- units are counted (a refusal writes nothing), so a limit raised mid-period admits at once and
-- one lowered below the count refuses only what comes next.
--!include calendar_open.lua
--!include calendar_refuse.lua
redis.call('INCRBY', key, cost)
redis.call('PEXPIREAT', key, b[i + 1])
return {1, left - cost, 0, reset, now_us, cost}
