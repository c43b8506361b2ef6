-- Heartbeat of one replica in one group (the replicas that enforce one policy), with the
-- configuration hash the replica applies.
-- KEYS[1] sorted set of instances scored by their last heartbeat (ms, Redis clock).
-- KEYS[2] hash of instance -> configuration hash; same hash tag as KEYS[1].
-- ARGV[1] instance id, ARGV[2] time-to-live of a heartbeat (ms), ARGV[3] configuration hash.
-- Returns the number of live instances.
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
for _, m in ipairs(dead) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return redis.call('ZCARD', KEYS[1])
