package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// MaxQueueSize bounds limit.queue.size (waiters of a key in one sidecar).
const MaxQueueSize = 10_000

// InFlightQueue is how requests of a full key wait for a slot.
type InFlightQueue struct {
	// size is how many requests of a key may wait in one sidecar at once, 1 to 10000.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	Size int32 `json:"size"`

	// timeout is the longest a request waits for a slot, 1ms to 10m, in Go's duration syntax
	// (such as 500ms, 30s or 2m); one that waits longer is refused with 429.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$')",message="limit.queue.timeout must be a duration such as 500ms, 30s or 2m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || (duration(self) >= duration('1ms') && duration(self) <= duration('10m'))",message="limit.queue.timeout must be between 1ms and 10m: a request waits no longer than that for a slot"
	// +required
	Timeout metav1.Duration `json:"timeout"`
}

// SlotLostAction is what becomes of a request whose in-flight slot is lost before it ends.
// +kubebuilder:validation:Enum=End;Finish
type SlotLostAction string

// The actions on a lost slot.
const (
	// SlotLostEnd ends the request: another may hold its place.
	SlotLostEnd SlotLostAction = "End"
	// SlotLostFinish lets the request run to its end, no longer counted.
	SlotLostFinish SlotLostAction = "Finish"
)
