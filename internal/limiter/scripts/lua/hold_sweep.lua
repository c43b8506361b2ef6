-- Holds, sweep: removes the records of holds nobody settled by their deadline. It is not a
-- script: scripts.go writes it in place of the line that includes it, in the window state's
-- scripts (fixed_window.lua and sliding_window_counter.lua when they reserve, hold_settle.lua).
--
-- A hold is a grant with a deadline: its units are counted in c and in its replica's share like
-- any grant, and a record in the zset hk (the state key's own, in its hash slot) names it, as
-- <window start>:<units>:<replica id>:<seq>, scored by its deadline (ms on Redis's clock, at
-- most a window after its reserve). A hold whose deadline passed unsettled is taken to be its
-- holder's last word: its holder died (or lost the settle), and its request may have been
-- served in full, so its units stay counted, spent, until its window ends. Nothing goes back;
-- the record only stops counting among the key's open holds (see the reserve's bound), and is
-- removed here. A late settle still finds the units counted, and gives back what its request
-- did not use (hold_settle.lua).
--
-- At most 16 records a call: hk is the tenant's own key, and a zset stuffed with a million
-- garbage members costs a call O(log n + 16), never more, and drains 16 a call.
--
-- In: hk, now (ms).
local hs_recs = redis.call('ZRANGEBYSCORE', hk, '-inf', now, 'LIMIT', 0, 16)
if #hs_recs > 0 then
  redis.call('ZREM', hk, unpack(hs_recs))
end
