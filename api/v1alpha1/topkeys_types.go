package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CandidateLimit is a limit counted beside a rule's on the same requests, in its own Redis
// state, that never refuses: what it would have refused is reported in the policy's status
// (status.rules[].candidate) and in metrics, so a limit is tried on live traffic before it is
// enforced. Promote it by editing the rule: the candidate's algorithm and limit become the
// rule's, and the candidate goes.
// Its rules that depend on the algorithm, which it may inherit from the rule, are on Rule.
type CandidateLimit struct {
	// algorithm the candidate counts with; the rule's when not set.
	// +optional
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// limit the candidate would enforce.
	// +required
	Limit Limit `json:"limit"`
}

// TopKeysReport says what sidecars report of a rule's top keys.
// +kubebuilder:validation:Enum=Hashes;Values
type TopKeysReport string

// The top-keys reports.
const (
	// TopKeysHashes reports each key by its hash only: the hex digits its Redis keys end with.
	TopKeysHashes TopKeysReport = "Hashes"
	// TopKeysValues reports each key's readable parts too (header values, client addresses,
	// paths), cut to 64 bytes: a header value can be a credential, so only where it is not.
	TopKeysValues TopKeysReport = "Values"
)

// MaxTopKeys is the most keys a rule's status lists of its refused keys, and of its
// candidate's.
const MaxTopKeys = 5

// RuleStatus is what the sidecars counted of one rule over their last reported interval,
// merged across the replicas.
type RuleStatus struct {
	// name of the rule.
	// +required
	Name string `json:"name"`

	// observedAt is when the controller wrote these counts: a merge that says the same is not
	// written again.
	// +required
	ObservedAt metav1.Time `json:"observedAt"`

	// interval is how long the merged summaries counted: the sidecars' heartbeat interval.
	// +optional
	Interval metav1.Duration `json:"interval,omitempty"`

	// replicas is how many replicas' summaries were merged.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// decisions counts the rule's decisions over the interval, across the replicas.
	// +optional
	Decisions int64 `json:"decisions,omitempty"`

	// refused counts the rule's refusals over the interval (for a Shadow rule: what it would
	// have refused).
	// +optional
	Refused int64 `json:"refused,omitempty"`

	// topRefused are the keys refused most over the interval, heaviest first.
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	// +optional
	TopRefused []TopKey `json:"topRefused,omitempty"`

	// candidate is what the rule's candidate limit would have done.
	// +optional
	Candidate *CandidateStatus `json:"candidate,omitempty"`

	// inFlight is what the replicas hold of an in-flight rule's slots.
	// +optional
	InFlight *InFlightStatus `json:"inFlight,omitempty"`

	// quota is how much of a long window's current period its heaviest users used.
	// +optional
	Quota *QuotaStatus `json:"quota,omitempty"`
}

// TopKey is one key of a top list, merged across replicas.
type TopKey struct {
	// key is the key's hash: the 32 hex digits its Redis keys end with
	// (rl:{<namespace>/<policy>/<rule>/<key>}...).
	// +required
	Key string `json:"key"`

	// value is the key's readable form (its parts, space-separated, cut to 64 bytes), only
	// when the rule's topKeys is Values. It is what clients sent: read it as untrusted text.
	// +optional
	Value string `json:"value,omitempty"`

	// count over-estimates the key's decisions over the interval by at most error.
	// +required
	Count int64 `json:"count"`

	// error bounds the over-estimate of count: the key was counted at least count-error times.
	// +optional
	Error int64 `json:"error,omitempty"`
}

// CandidateStatus is what a rule's candidate limit would have refused.
type CandidateStatus struct {
	// limit is the candidate counted, such as "30/1m0s SlidingWindowCounter".
	// +required
	Limit string `json:"limit"`

	// since is when the controller first merged this candidate's counts; a change of the
	// candidate starts it again.
	// +required
	Since metav1.Time `json:"since"`

	// wouldRefuse counts what the candidate would have refused over the interval.
	// +optional
	WouldRefuse int64 `json:"wouldRefuse,omitempty"`

	// wouldRefuseRatio is wouldRefuse over the rule's decisions of the interval, such as "12.5%".
	// +optional
	WouldRefuseRatio string `json:"wouldRefuseRatio,omitempty"`

	// wouldRefuseTotal and decisionsTotal sum the intervals merged since since (an interval
	// the controller did not read is missing from both).
	// +optional
	WouldRefuseTotal int64 `json:"wouldRefuseTotal,omitempty"`
	// +optional
	DecisionsTotal int64 `json:"decisionsTotal,omitempty"`

	// topRefused are the keys the candidate would have refused most over the interval.
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	// +optional
	TopRefused []TopKey `json:"topRefused,omitempty"`
}
