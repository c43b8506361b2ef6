-- The live members of one group and the configuration hash of each, for the manager.
-- KEYS[1] the group's sorted set, KEYS[2] its hash (see group_heartbeat.lua).
-- ARGV[1] time-to-live of a heartbeat (ms), ARGV[2] most members returned, ARGV[3] most bytes
-- of a member name or hash returned.
-- Returns {live count, losses, member 1, hash 1, member 2, hash 2, ...}: losses counts the
-- heartbeats that said Redis lost counts of the group (see group_heartbeat.lua).
--
-- A tenant can write its own group's keys, so what the manager reads of them is bounded here:
-- at most ARGV[2] members, each name and hash cut to ARGV[3] bytes. Live is what the heartbeat
-- script counts: a last beat within the TTL of Redis's now, never after it.
--
-- The bounds are capped here, not only by the caller: every script in Redis's cache can be run
-- by anyone allowed EVALSHA (ACL cannot tell SHAs apart), a tenant's user included, and one call
-- with ARGV[2] = 1e9 over a group stuffed with 2,000,000 members held Redis 4.5 s for every
-- tenant. MOST and WIDTH are fleet.MaxMembers and fleet.MaxMemberBytes; ARGV can only lower them.
-- MOST is 2,000: a read of 10,000 members held Redis 20 to 60 ms (see fleet.MaxMembers).
-- A negative LIMIT count would mean "all" to Redis and a negative string.sub end "to the end",
-- so anything not a number in [0, cap] (nil, NaN, negative, inf) reads as the cap.
local MOST, WIDTH = 2000, 256
local ttl = tonumber(ARGV[1])
if not ttl or ttl ~= ttl then
  return redis.error_reply('ERR group members: ttl is not a number')
end
local most = math.floor(tonumber(ARGV[2]) or MOST)
if not (most >= 0 and most <= MOST) then
  most = MOST
end
local width = math.floor(tonumber(ARGV[3]) or WIDTH)
if not (width >= 0 and width <= WIDTH) then
  width = WIDTH
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min = '(' .. (now - ttl)
local out = {redis.call('ZCOUNT', KEYS[1], min, now), tonumber(redis.call('HGET', KEYS[2], '!losses')) or 0}
if most == 0 then
  return out -- none asked for: no range read at all
end
-- The hashes by HMGET of up to 1,000 members at once rather than one HGET each: 10,000
-- members read in a third to a half less time (34 ms then, 21 ms now, one quiet run; 110 and
-- 35 ms on a loaded machine), and this is the longest any tenant can hold Redis with a
-- script. 1,000, not all: Lua's unpack refuses a few thousand values.
local members = redis.call('ZRANGEBYSCORE', KEYS[1], min, now, 'LIMIT', 0, most)
local n = #out
for i = 1, #members, 1000 do
  local last = math.min(i + 999, #members)
  local hashes = redis.call('HMGET', KEYS[2], unpack(members, i, last))
  for j = i, last do
    local m, h = members[j], hashes[j - i + 1]
    if #m > width then
      m = string.sub(m, 1, width)
    end
    if type(h) ~= 'string' then
      h = ''
    elseif #h > width then
      h = string.sub(h, 1, width)
    end
    out[n + 1], out[n + 2] = m, h
    n = n + 2
  end
end
return out
