-- Holds, sweep, for TokenBucket: gives back the tokens of holds nobody settled by their
-- deadline (see hold_sweep.lua, which does it for the window state). Not a script: included by
-- token_bucket.lua when it reserves and by hold_settle_tb.lua. A record is
-- 0:<units>:<replica id>:<seq> in hk, scored by its deadline (ms on Redis's clock, at most a
-- window after its reserve); a record past it moves the TAT back by its units, never before now.
-- At most 16 records a call, each read by length and one anchored pattern, as hold_sweep.lua.
-- In: hk, now_ms, interval, ahead, swept (declared false by the includer: the fragment runs
-- inside an if in token_bucket.lua, and a local here would die with it). Out: ahead lowered,
-- swept (it changed).
local hs_recs = redis.call('ZRANGEBYSCORE', hk, '-inf', now_ms, 'LIMIT', 0, 16)
if #hs_recs > 0 then
  redis.call('ZREM', hk, unpack(hs_recs))
  for _, m in ipairs(hs_recs) do
    local u = #m <= 160 and tonumber(string.match(m, '^0:(%d+):.*:[^:]+$'))
    if u and u >= 1 and ahead > 0 then
      ahead, swept = math.max(ahead - u * interval, 0), true
    end
  end
end
