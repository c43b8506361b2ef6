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
local ttl = tonumber(ARGV[1])
local most = tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min = '(' .. (now - ttl)
local out = {redis.call('ZCOUNT', KEYS[1], min, now), tonumber(redis.call('HGET', KEYS[2], '!losses')) or 0}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], min, now, 'LIMIT', 0, most)) do
  local h = redis.call('HGET', KEYS[2], m)
  out[#out + 1] = string.sub(m, 1, width)
  if type(h) == 'string' then
    out[#out + 1] = string.sub(h, 1, width)
  else
    out[#out + 1] = ''
  end
end
return out
