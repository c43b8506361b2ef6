package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// InFlightStatus is what the live replicas hold of an in-flight rule's slots, as their last
// reports said: a gauge, summed over the replicas.
type InFlightStatus struct {
	// limit is the rule's limit: requests of one key in progress at once.
	// +required
	Limit int64 `json:"limit"`

	// held counts the slots the replicas held at their last reports, all keys together.
	// +optional
	Held int64 `json:"held,omitempty"`

	// peak sums each replica's most slots held at once over its last interval: no more were
	// held at once over the fleet, and fewer may have been (the replicas' peaks need not
	// coincide).
	// +optional
	Peak int64 `json:"peak,omitempty"`

	// queued counts the requests waiting in the replicas for a slot of a full key.
	// +optional
	Queued int64 `json:"queued,omitempty"`

	// use says how full the busiest key is, such as "7 of 8 slots (87.5%)".
	// +optional
	Use string `json:"use,omitempty"`

	// topHolders are the keys holding the most slots, the most first; count is the slots the
	// key held over the replicas.
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	// +optional
	TopHolders []TopKey `json:"topHolders,omitempty"`
}

// QuotaStatus is how much of a long window's quota its heaviest users used: for a calendar
// Day, Week or Month, or a rolling window over 24 hours.
type QuotaStatus struct {
	// period names what the quota counts, such as "Month in Europe/Berlin" or "72h0m0s rolling".
	// +required
	Period string `json:"period"`

	// limit is the quota: requests of a key per period.
	// +required
	Limit int64 `json:"limit"`

	// resetsAt is when the current calendar period ends and every key's count starts again;
	// none for a rolling window.
	// +optional
	ResetsAt *metav1.Time `json:"resetsAt,omitempty"`

	// used says how much the heaviest user used, such as "used 812 of 1000 this month (81.2%)".
	// +optional
	Used string `json:"used,omitempty"`

	// topUsers are the keys that used the most of the period's quota, the most first.
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	// +optional
	TopUsers []QuotaUser `json:"topUsers,omitempty"`
}

// QuotaUser is one key's use of a long window's quota.
type QuotaUser struct {
	// key is the key's hash: the 32 hex digits its Redis keys end with.
	// +required
	Key string `json:"key"`

	// value is the key's readable form, only when the rule's topKeys is Values. It is what
	// clients sent: read it as untrusted text.
	// +optional
	Value string `json:"value,omitempty"`

	// used is the key's count in the period, as Redis last answered a replica's decision of it
	// (units leased to a replica count as used).
	// +required
	Used int64 `json:"used"`

	// share is used over the limit, such as "81.2%".
	// +optional
	Share string `json:"share,omitempty"`
}
