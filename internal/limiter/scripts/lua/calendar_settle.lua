-- Calendar window, a settle (see internal/limiter/calendar_hold.go): ends a hold of
-- calendar_reserve.lua with what its request used, or charges units used without a hold.
-- KEYS[1..3] the periods' counts and ARGV[1..8] as calendar_window.lua, with cost 0 and no
-- deadline; KEYS[4] the hold records, ARGV[9] the hold's record (<period start>:<units>:<tag>;
-- 0 units for a charge), ARGV[10] units used, ARGV[11] the hold's deadline (ms on Redis's clock).
-- Shares (see calendar_shares_open.lua), when ARGV[12] (the replica's id) is not empty: KEYS[5..7]
-- the periods' share hashes and ARGV[12..18] as calendar_window.lua's ARGV[9..15] (a settle
-- starts no hold: ARGV[16] is 0), the known share being what the replica knew before this
-- settle's own lowering, and the stamp counting that lowering (see hold_settle.lua).
-- Returns {returned, debt, expired, restored, now_us, counted} as hold_settle.lua, or
-- calendar_open.lua's miss ({0, 0, -4, 0, now_us, 0}: nothing was done, the caller asks again
-- around now_us).
--
-- The replica's share of the period is restored first, as by a decision; then the record
-- decides, removed first:
--   - of the period holding Redis's clock: used < units gives units - used back to it (at most
--     what it counts, and what this Redis holds of the replica's share: a count lost with a
--     Redis gives nothing back it did not hold), out of the share too;
--     used > units counts the excess in it, past the limit if need be (debt), in the share too;
--   - of a period that has ended (a hold taken before the reset, settled after it): its units
--     ended with that period and nothing goes back to the new one, which never counted them;
--     the excess counts in the new period, the one the settle ran in, and in its share.
-- Debt is counted up to a count of 2^40 (counted says how much) and stays in its period: a
-- period's key is its own, and the next starts from nothing (no carry, unlike fixed_window.lua).
--!include calendar_open.lua
local hk, member, used, hdl = KEYS[4], ARGV[9] or '', tonumber(ARGV[10]), tonumber(ARGV[11])
if not (hk and whole(used, 0, 2^50) and whole(hdl, 0, 1e16)) then
  return redis.error_reply('ERR calendar settle: KEYS[4], and whole used from 0 to 2^50 and deadline from 0 to 1e16')
end
local hstart, units
if #member <= 160 then
  local x, y = string.match(member, '^(%d+):(%d+):.*:[^:]+$')
  hstart, units = tonumber(x), tonumber(y)
end
if not (whole(hstart, 0, 1e16) and whole(units, 0, 1e15)) then
  return redis.error_reply('ERR calendar settle: the record must read <period start>:<units>:<tag>, 160 bytes at most')
end
if hstart > b[i] then
  return redis.error_reply('ERR calendar settle: the record names a period that has not begun')
end
local sk, so = 4, 11
--!include calendar_shares_open.lua
local present = redis.call('ZSCORE', hk, member)
if present then
  redis.call('ZREM', hk, member)
end
--!include hold_sweep.lua
local returned, debt, expired, add = 0, 0, 0, 0
if not present and now >= hdl then
  expired = 1
end
if hstart == b[i] and used < units then
  returned = math.min(units - used, cur)
  if id ~= '' then
    returned = math.min(returned, mine)
  end
  add = -returned
else
  debt = math.max(used - units, 0)
  add = math.min(debt, math.max(2^40 - cur, 0))
end
--!include calendar_shares_close.lua
return {returned, debt, expired, restored, now_us, math.max(add, 0)}
