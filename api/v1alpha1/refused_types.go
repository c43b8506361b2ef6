package v1alpha1

// RefusedRequests says whether a rule counts the requests that are refused, by it or by
// another rule they match.
// +kubebuilder:validation:Enum=Uncounted;Counted
type RefusedRequests string

// The ways a rule counts refused requests.
const (
	// RefusedUncounted counts a request only when it is admitted: all the rules a request
	// matches decide it as one, and a request that any of them refuses counts in none of them
	// (what the others counted goes back at once). A client over its own limit then spends
	// nothing of the limits it shares with others.
	RefusedUncounted RefusedRequests = "Uncounted"
	// RefusedCounted counts every request the rule admitted, including those another rule
	// refused (a request the rule itself refuses is never counted): envoyproxy/ratelimit's
	// behaviour, where a shared limit also meters what was attempted.
	RefusedCounted RefusedRequests = "Counted"
)
