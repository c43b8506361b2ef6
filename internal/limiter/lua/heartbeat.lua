-- Replica heartbeat: records that an instance is alive and returns how many are.
-- KEYS[1] sorted set of instances scored by their last heartbeat (ms, Redis clock).
-- ARGV[1] instance id, ARGV[2] time-to-live of a heartbeat (ms).
local key = KEYS[1]
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', key, now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - ttl)
redis.call('PEXPIRE', key, ttl)
return redis.call('ZCARD', key)
