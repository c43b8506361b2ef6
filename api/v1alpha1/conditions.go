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

// Reasons of the RedisConnectionBudget condition and of the budget's Events.
const (
	ReasonOverBudget          = "OverBudget"
	ReasonWithinBudget        = "WithinBudget"
	ReasonNoInjectedWorkloads = "NoInjectedWorkloads"
	ReasonBudgetUnknown       = "RedisUnavailable"
)

// Reasons of the RedisDurability condition.
const (
	ReasonDurable             = "Durable"
	ReasonCountsLostOnRestart = "CountsLostOnRestart"
	// ReasonCountsLostSinceSnapshot: no append-only file, but RDB snapshots that succeed: a
	// restart loses what was counted since the last one.
	ReasonCountsLostSinceSnapshot = "CountsLostSinceSnapshot"
	ReasonDurabilityUnsupported   = "DurabilityUnsupported"
	ReasonNoReplica               = "NoReplica"
)

// Reasons of the RedisMemoryPolicy condition.
const (
	ReasonNoEviction       = "NoEviction"
	ReasonNoMaxmemory      = "NoMaxmemory"
	ReasonEvictionPossible = "EvictionPossible"
	ReasonMemoryUnknown    = "RedisUnavailable"
)

// ReasonServiceBypassesSidecar is the Enforced reason of a policy whose pods a Service reaches
// on the application's port, around the sidecar.
const ReasonServiceBypassesSidecar = "ServiceBypassesSidecar"

// ReasonUndecodable is the Event reason on a stored policy that does not decode into v1alpha1.
const ReasonUndecodable = "Undecodable"

// Programmed reasons of a namespace whose policies do not fit.
const (
	// ReasonConfigMapTooLarge: the document, even gzip-compressed, is over what a ConfigMap holds.
	ReasonConfigMapTooLarge = "ConfigMapTooLarge"
	// ReasonDocumentTooLarge: the document is over what the default sidecar loads within its
	// memory limit (policydoc.MaxDocumentBytes).
	ReasonDocumentTooLarge = "DocumentTooLarge"
)

// ReasonRedisLostCounts is the reason of the Warning Event on a policy whose sidecars found Redis
// holding less than they had been granted (a failover to a replica that lagged, a restart
// without persistence) and restored it from their shares.
const ReasonRedisLostCounts = "RedisLostCounts"

// ReasonPodsWithoutSidecar is the Enforced reason of a policy that selects Ready pods that run
// without the Redline sidecar: their traffic is not limited.
const ReasonPodsWithoutSidecar = "PodsWithoutSidecar"

// Reasons of Accepted, Programmed and Enforced, which the policy reconciler writes.
const (
	ReasonAccepted         = "Accepted"
	ReasonInvalid          = "Invalid"
	ReasonProgrammed       = "Programmed"
	ReasonRedisUnavailable = "RedisUnavailable"
	ReasonConfigMapError   = "ConfigMapError"
	ReasonEnforced         = "Enforced"
	ReasonPropagating      = "Propagating"
	ReasonNoSidecars       = "NoSidecars"
)

// Enforced reasons of reports that were not read.
const (
	// ReasonSidecarReportsOverBound: the policy's group holds more live heartbeats than were
	// left of what the manager reads per namespace (fleet.Summarize); they were counted only.
	ReasonSidecarReportsOverBound = "SidecarReportsOverBound"
	// ReasonNotWritten: the namespace's configuration was not written (see Programmed), so
	// there is nothing to compare the sidecars' reports with; they are not read.
	ReasonNotWritten = "ConfigurationNotWritten"
)

// Reasons of a RedisBackend's Ready condition.
const (
	ReasonBackendReady       = "Ready"
	ReasonBackendInvalid     = "InvalidSpec"
	ReasonBackendSecretError = "CredentialsSecretError"
	ReasonBackendUnavailable = "RedisUnavailable"
	ReasonBackendDialError   = "DialError"
)

// ReasonSentinelUnprotected is the TenantIsolation reason where the sentinels let anyone who
// reaches them, a tenant's pod included, reconfigure the group.
const ReasonSentinelUnprotected = "SentinelUnprotected"

// Reasons of the TenantIsolation condition.
const (
	ReasonTenantIsolated       = "RedisACLUser"
	ReasonRedisACLUnavailable  = "RedisACLUnavailable"
	ReasonTenantACLDisabled    = "TenantACLDisabled"
	ReasonTenantCredentialsErr = "CredentialsSecretError"
	ReasonRedisDefaultUserOpen = "RedisDefaultUserOpen"
)

// TopKeys reasons.
const (
	// ReasonTopKeysMerged: every live sidecar's summary was read and merged.
	ReasonTopKeysMerged = "Merged"
	// ReasonSummariesOverBound: the namespace's summaries are more than the manager reads of
	// one namespace per interval (fleet.NamespaceSummaryBytes); some were not read.
	ReasonSummariesOverBound = "SummariesOverBound"
	// ReasonInvalidSummaries: some summaries in the policy's group could not be decoded: they
	// were written by something other than a sidecar, and are left out.
	ReasonInvalidSummaries = "InvalidSummaries"
)
