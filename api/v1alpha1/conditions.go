package v1alpha1

// Condition types of a RateLimitPolicy.
const (
	// ConditionAccepted is True when the spec compiled.
	ConditionAccepted = "Accepted"
	// ConditionProgrammed is True when the policy is in the namespace's ConfigMap and its
	// scripts are loaded in Redis.
	ConditionProgrammed = "Programmed"
	// ConditionEnforced is True when sidecars report applying the current configuration.
	ConditionEnforced = "Enforced"
	// ConditionRedisConnectionBudget is False when the workloads the policy targets are part of
	// a worst case (every injected workload at its maxReplicas, each pod with its full Redis
	// pool) that exceeds Redis's maxclients.
	ConditionRedisConnectionBudget = "RedisConnectionBudget"
	// ConditionRedisMemoryPolicy is False when a Redis node can evict keys to make room
	// (maxmemory set, maxmemory-policy not noeviction): another tenant's writes can then evict
	// this policy's counts, and its clients are admitted again.
	ConditionRedisMemoryPolicy = "RedisMemoryPolicy"
)

// ConditionTopKeys is True when the sidecars' top-keys summaries of the policy are merged
// whole into status.rules; False when some were not read (over the manager's bound for the
// namespace) or could not be decoded (written by something other than a sidecar).
const ConditionTopKeys = "TopKeys"

// ConditionTenantIsolation is True when the sidecars of the policy's namespace reach Redis as
// a user of their own, limited to the namespace's keys; False when they share a credential
// with other namespaces (Redis refuses ACLs, or the manager was told not to use them).
const ConditionTenantIsolation = "TenantIsolation"
