-- The summaries of top keys the live members of one group published (group_heartbeat.lua,
-- KEYS[3]), for the manager.
-- KEYS[1] the group's sorted set. ARGV[1] time-to-live of a heartbeat (ms), ARGV[2] most
-- members read, ARGV[3] most bytes of one summary read.
-- Returns {live count, stopped, member 1, summary 1, member 2, summary 2, ...}: stopped is 1
-- when the bytes ran out before the last member was read, 0 otherwise; only members whose
-- summary key holds a string; a summary longer than the bound comes back cut (and fails to
-- decode: the manager counts it as invalid).
--
-- A tenant can write every key of its group, its summaries included, and can run this script
-- with any ARGV (see group_members.lua), so its work is capped here: at most MOST members, each
-- summary read with GETRANGE of at most WIDTH bytes (Redis copies only those), at most TOTAL
-- bytes in all (or ARGV[4], when lower), and a member name longer than NAME bytes is skipped (no key is built from it).
-- A summary key the tenant made something other than a string is skipped, not an error.
-- MOST, WIDTH and TOTAL are fleet.MaxMembers, fleet.SummaryStoredBytes and
-- fleet.SummaryReadBytes; ARGV can only lower them.
local MOST, WIDTH, TOTAL, NAME = 2000, 16384, 4194304, 253
local ttl = tonumber(ARGV[1])
if not ttl or ttl ~= ttl then
  return redis.error_reply('ERR group summaries: ttl is not a number')
end
local most = math.floor(tonumber(ARGV[2]) or MOST)
if not (most >= 0 and most <= MOST) then
  most = MOST
end
local width = math.floor(tonumber(ARGV[3]) or WIDTH)
if not (width >= 1 and width <= WIDTH) then
  width = WIDTH
end
local total = math.floor(tonumber(ARGV[4]) or TOTAL)
if not (total >= 0 and total <= TOTAL) then
  total = TOTAL
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min = '(' .. (now - ttl)
local out = {redis.call('ZCOUNT', KEYS[1], min, now), 0}
if most == 0 then
  return out
end
local left = total
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], min, now, 'LIMIT', 0, most)) do
  if left <= 0 then
    out[2] = 1
    break
  end
  if #m <= NAME then
    local v = redis.pcall('GETRANGE', KEYS[1] .. ':top:' .. m, 0, math.min(width, left) - 1)
    if type(v) == 'string' and #v > 0 then
      out[#out + 1] = m
      out[#out + 1] = v
      left = left - #v
    end
  end
end
return out
