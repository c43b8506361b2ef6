package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DurabilityMode is what a rule's grant waits for before the request it admits goes on.
// +kubebuilder:validation:Enum=None;Replica;AppendOnlyFile
type DurabilityMode string

// The durability modes.
const (
	// DurabilityNone answers as soon as the script counted the grant in Redis's memory: a
	// restart without persistence loses the window's counts, a failover the last writes the
	// replica had not received yet (the sidecars' shares restore what live replicas admitted).
	DurabilityNone DurabilityMode = "None"
	// DurabilityReplica waits until a replica acknowledged the grant (WAIT 1 <timeout>): a
	// promoted replica holds every grant acknowledged this way.
	DurabilityReplica DurabilityMode = "Replica"
	// DurabilityAppendOnlyFile waits until the master wrote the grant to its append-only file
	// and fsynced it (WAITAOF 1 0 <timeout>, Redis 7.2 or later, appendonly yes): a restart
	// reloads every grant acknowledged this way.
	DurabilityAppendOnlyFile DurabilityMode = "AppendOnlyFile"
)

// Durability says what a rule's grants wait for before they are answered. A grant whose
// acknowledgement does not come within timeout still stands: the request is admitted, later by
// at most timeout, and the sidecar counts it in
// redline_sidecar_durability_unacknowledged_total; a Redis that cannot give the mode at all
// (no replica, appendonly no, WAITAOF unknown before Redis 7.2) is reported by the
// RedisDurability condition.
type Durability struct {
	// mode is None (the default), Replica (WAIT for one replica) or AppendOnlyFile (WAITAOF
	// for the master's fsynced append-only file, Redis 7.2 or later).
	// +kubebuilder:default=None
	// +optional
	Mode DurabilityMode `json:"mode,omitempty"`

	// timeout is the longest a grant waits for its acknowledgement, between 1ms and 5s
	// (default 100ms). Redis notices a timed-out wait on its next event-loop tick (hz: 10 a
	// second by default), so a grant can wait up to 100ms more.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$')",message="durability.timeout must be a duration such as 100ms or 1s"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || (duration(self) >= duration('1ms') && duration(self) <= duration('5s'))",message="durability.timeout must be between 1ms and 5s"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// Bounds and default of Durability.Timeout; the markers repeat them as literals.
const (
	MinDurabilityTimeout     = time.Millisecond
	MaxDurabilityTimeout     = 5 * time.Second
	DefaultDurabilityTimeout = 100 * time.Millisecond
)

// LongWindow is the window from which a rule's counts are worth keeping across a Redis
// restart: the RedisDurability condition reports a rule at least this long on a Redis that
// would lose them.
const LongWindow = time.Hour

// ConditionRedisDurability is set on a policy with a long-window rule (LongWindow or longer) or
// a rule asking durability: False when the namespace's Redis would lose that rule's counts on a
// restart (no append-only file), or cannot give the durability it asks (no replica for
// Replica; appendonly no, or a Redis before 7.2, for AppendOnlyFile).
const ConditionRedisDurability = "RedisDurability"
