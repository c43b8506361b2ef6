-- Holds, sweep, for TokenBucket: removes the records of holds nobody settled by their deadline
-- (see hold_sweep.lua, which does it for the window state). Not a script: included by
-- token_bucket.lua when it reserves and by hold_settle_tb.lua. A record is
-- 0:<units>:<replica id>:<seq> in hk, scored by its deadline (ms on Redis's clock, at most a
-- window after its reserve). Its tokens stay taken: the TAT is not moved back, so a hold whose
-- holder died counts as spent, and the bucket refills it at its rate.
-- At most 16 records a call, as hold_sweep.lua. In: hk, now_ms.
local hs_recs = redis.call('ZRANGEBYSCORE', hk, '-inf', now_ms, 'LIMIT', 0, 16)
if #hs_recs > 0 then
  redis.call('ZREM', hk, unpack(hs_recs))
end
