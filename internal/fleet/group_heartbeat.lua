-- Heartbeat of one replica in one group (the replicas that enforce one policy), with the
-- configuration hash the replica applies.
-- KEYS[1] sorted set of instances scored by their last heartbeat (ms, Redis clock).
-- KEYS[2] hash of instance -> configuration hash; same hash tag as KEYS[1].
-- ARGV[1] instance id, ARGV[2] time-to-live of a heartbeat (ms), ARGV[3] configuration hash,
-- ARGV[4] '1' when the instance found Redis short of its shares since its last beat.
-- KEYS[3], optional: the instance's summary of the policy's top keys (see fleet.SummaryKey),
-- set to "<now> <ARGV[5]>" with the heartbeat's TTL (now: Redis's clock, ms, which tells the
-- manager which summaries it merged already), or removed when ARGV[5] is empty. A summary over
-- 16352 bytes (fleet.SummaryMaxBytes) is refused, whoever runs the script; the manager bounds
-- what it reads anyway, since a tenant can SET the key itself.
-- Returns {live, losses, previous, now}: live is the number of live instances, those whose last
-- heartbeat is within the TTL of Redis's now, never after it; losses counts the beats that
-- said Redis lost counts (field !losses of KEYS[2]: no instance is named so), which tells
-- every replica to re-assert its shares; previous is the instance's last beat as this Redis
-- holds it (ms, 0 for none), which tells a replica that Redis lost its writes since; now is
-- Redis's clock (ms).
--
-- The score is Redis's TIME, taken here: no caller can choose it. Scores are only ever written
-- by this script, so a member scored after now was written by something else (a ZADD by hand,
-- or a master whose clock ran ahead before a failover); counting it would inflate the group,
-- and LocalFallback would divide the limit by replicas that do not exist. Such a member goes,
-- like a dead one; a real replica scored ahead by a failover comes back with its next beat.
-- Each beat removes at most `batch` members of each kind, so a group stuffed with members
-- costs every beat O(log N + batch), never a pass over the whole set; the count is a ZCOUNT.
-- batch is a constant, not an argument: a tenant's user may run this script with any ARGV.
--
-- The TTL must be a whole number of ms, at least 1: checked before anything is written, so that
-- a bad one (NaN, inf, negative, 1e300, which PEXPIRE refuses or takes as "delete now") fails
-- the call instead of leaving a member in a key without a TTL.
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl > 1e15 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR group heartbeat: ttl must be a whole number of ms from 1 to 1e15')
end
local batch = 256
if KEYS[3] and ARGV[5] and #ARGV[5] > 16352 then
  return redis.error_reply('ERR group heartbeat: a summary is at most 16352 bytes')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local previous = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) or 0
redis.call('ZADD', KEYS[1], now, ARGV[1])
local function drop(members)
  for _, m in ipairs(members) do
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
  end
end
drop(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl, 'LIMIT', 0, batch))
drop(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, batch))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local losses
if ARGV[4] == '1' then
  losses = redis.call('HINCRBY', KEYS[2], '!losses', 1)
else
  losses = tonumber(redis.call('HGET', KEYS[2], '!losses')) or 0
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
if KEYS[3] then
  if ARGV[5] and #ARGV[5] > 0 then
    redis.call('SET', KEYS[3], now .. ' ' .. ARGV[5], 'PX', ttl)
  else
    redis.call('UNLINK', KEYS[3])
  end
end
return {redis.call('ZCOUNT', KEYS[1], '(' .. (now - ttl), now), losses, previous, now}
