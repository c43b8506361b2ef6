-- Holds, the bound of open holds: a key holds at most hmax holds at once, so that what its
-- requests spend past their holds (debt, known only at their settles) is bounded by as many
-- requests. It is not a script: scripts.go writes it in place of the line that includes it, at
-- the top level of the reserving scripts (fixed_window.lua, sliding_window_counter.lua,
-- token_bucket.lua, sliding_window_log.lua), after they decided what to grant and before they
-- write it.
--
-- Open holds are the records in hk before their deadline: one ZCOUNT, O(log n), whatever the
-- zset holds (it is the tenant's own key: members it adds count against its own key only). A
-- hold past its deadline no longer counts: its holder is taken for dead (its units stay spent,
-- see hold_sweep.lua). A grant that would make hmax + 1 is not made (add = 0), and the call is
-- refused with hb_retry: the soonest open deadline, at most a second (a settle frees a hold at
-- any time; the limiter forgets a refusal at each settle).
--
-- hb_open also says whether any hold of the key is open: a reserve refused while one is retries
-- after a second at most, whatever the window says, since a settle gives back what its request
-- did not use at any time (a request with no output cap holds all the budget has, and the next
-- one would otherwise be told to wait for the window's end).
-- In: htag (a hold asks), hk, hb_now (now, ms), hmax, add (the units about to be granted). Out: add,
-- hb_retry (ms; 0: not refused by the bound), hb_open (the open holds, 0 for a plain decision).
local hb_retry, hb_open = 0, 0
if htag then
  hb_open = redis.call('ZCOUNT', hk, string.format('(%d', hb_now), '+inf')
end
if add > 0 and hb_open >= hmax then
  local hb_first = redis.call('ZRANGEBYSCORE', hk, string.format('(%d', hb_now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  hb_retry = 1000
  if hb_first[2] and tonumber(hb_first[2]) then
    hb_retry = math.max(math.min(tonumber(hb_first[2]) - hb_now, 1000), 1)
  end
  add = 0
end
