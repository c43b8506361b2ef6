// Package limiter decides rate limits that hold across every replica of a service, using Redis
// as the one shared counter. It knows nothing of Kubernetes: a key and a Limit go in, a Result
// comes out.
//
// Every decision is one Lua script (one per Algorithm, in package scripts) run with
// EVALSHA, so read-modify-write is atomic in Redis, every key gets its TTL in the same script
// that writes it, and every timestamp comes from Redis's TIME rather than from a pod's clock.
// The scripts rely on effects replication, the default since Redis 5. Keys follow
// rl:{<namespace>/<policy>/<rule>/<hash>}:<suffix> (see package keyscheme); the braces keep all keys of one
// limit in one Redis Cluster slot.
//
// Around the scripts, a Limiter
//   - batches concurrent decisions into pipelines (one per node on a cluster), so Redis round
//     trips per decision fall as concurrency rises, and decides inline when it is idle;
//   - answers NOSCRIPT (restart, failover, SCRIPT FLUSH) with SCRIPT LOAD and one retry
//     (scripts.Exec);
//   - remembers refused keys until their retry-after (the pre-check), in a bounded LRU;
//   - wraps Redis in circuit breakers, one per shard (each master of a Redis Cluster, or the
//     one Redis), and while the breaker of a key's shard is open decides by the limit's
//     FailureMode: admit, refuse, or enforce Requests / Limit.Replicas locally, the replica
//     count coming from heartbeats in Redis (package fleet);
//   - in shadow mode computes and counts the decision but admits.
//
// The manager loads and checks the scripts with package scripts; the sidecar builds its client
// with package redisconn and decides with New and Allow.
package limiter
