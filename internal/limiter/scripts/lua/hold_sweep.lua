-- Holds, sweep: gives back the units of holds nobody settled by their deadline. It is not a
-- script: scripts.go writes it in place of the line that includes it, in the window state's
-- scripts (fixed_window.lua and sliding_window_counter.lua when they reserve, hold_settle.lua),
-- before shares_open.lua reads the state, so that the units it frees count at once.
--
-- A hold is a grant with a deadline: its units are counted in c and in its replica's share like
-- any grant, and a record in the zset hk (the state key's own, in its hash slot) names it, as
-- <window start>:<units>:<replica id>:<seq>, scored by its deadline (ms on Redis's clock, at
-- most the end of its window). A record past its deadline whose window is still the state's
-- gives its units back: c by min(units, c), its replica's share by as much (as lease_return.lua
-- does), so a failover does not restore them. A record of an ended window is only removed: its
-- units ended with it.
--
-- At most 16 records a call, each read by length first (160 bytes at most) and by one anchored
-- pattern: hk is the tenant's own key, and a zset stuffed with a million garbage members costs a
-- call O(log n + 16), never more, and drains 16 a call.
--
-- In: key, hk, window, start, now (ms), id, ms, m1. Out: m1 lowered by what this replica's own
-- expired holds gave back (its caller counted them in what it knows of its share).
local hs_recs = redis.call('ZRANGEBYSCORE', hk, '-inf', now, 'LIMIT', 0, 16)
if #hs_recs > 0 then
  redis.call('ZREM', hk, unpack(hs_recs))
  local hs_s = redis.call('HGET', key, 's')
  if hs_s and #hs_s <= 80 then
    hs_s = tonumber(string.match(hs_s, '^(%d+)'))
  else
    hs_s = nil
  end
  if hs_s == start then
    local hs_c = tonumber(redis.call('HGET', key, 'c')) or 0
    local hs_q = (start / window) % 4096
    local hs_back, hs_owners = 0, {}
    for _, m in ipairs(hs_recs) do
      if #m <= 160 and hs_c > 0 then
        local ws, u, owner = string.match(m, '^(%d+):(%d+):(.*):[^:]+$')
        ws, u = tonumber(ws), tonumber(u)
        if ws == start and u and u >= 1 then
          local n = math.min(u, hs_c)
          hs_c, hs_back = hs_c - n, hs_back + n
          if #owner >= 2 and #owner <= 64 and string.sub(owner, 1, 1) ~= '@' then
            hs_owners[owner] = (hs_owners[owner] or 0) + n
          end
        end
      end
    end
    if hs_back > 0 then
      redis.call('HSET', key, 'c', hs_c)
      for owner, n in pairs(hs_owners) do
        local f = tonumber(redis.call('HGET', key, owner))
        if f and f % 4096 == hs_q then
          redis.call('HSET', key, owner, math.max((f - hs_q) / 4096 - n, 0) * 4096 + hs_q)
        end
        if owner == id and ms == start then
          m1 = math.max(m1 - n, 0)
        end
      end
    end
  end
end
