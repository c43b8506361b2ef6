-- Holds, sweep, for SlidingWindowLog: ends the holds nobody settled by their deadline (see
-- hold_sweep.lua, which does it for the window state). Not a script: included by
-- sliding_window_log.lua when it reserves and by hold_settle_swl.lua. A hold of the log is not
-- in the log: its units are in held (the string KEYS[3], the sum of the open holds' units) and
-- its record, 0:<units>:<replica id>:<seq>, in hk, scored by its deadline (ms on Redis's clock,
-- at most a window after its reserve). A hold whose deadline passed unsettled counts as spent
-- (its holder died, and its request may have been served in full): a record past it moves its
-- units from held to spent, which the includer appends to the log at now, as a settle appends
-- what its request used, so they count for a window more; never below 0 in held.
-- At most 16 records a call, each read by length and one anchored pattern, as hold_sweep.lua.
-- In: hk, now (ms), held, swept and spent (false and 0; declared by the includer, since an
-- include inside a block would make a local of its own that the block's end forgets). Out: held
-- lowered, spent (what it took off held), swept (held changed).
local hs_recs = redis.call('ZRANGEBYSCORE', hk, '-inf', now, 'LIMIT', 0, 16)
if #hs_recs > 0 then
  redis.call('ZREM', hk, unpack(hs_recs))
  for _, m in ipairs(hs_recs) do
    local u = #m <= 160 and tonumber(string.match(m, '^0:(%d+):.*:[^:]+$'))
    if u and u >= 1 and held > 0 then
      u = math.min(u, held)
      held, spent, swept = held - u, spent + u, true
    end
  end
end
