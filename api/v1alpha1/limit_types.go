package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// DurationPattern is Go's time.ParseDuration syntax, which metav1.Duration decodes with: the
// API server's own "duration" format also takes units Go refuses (d, w), and an object it
// stores that the controller cannot decode would stop the controller's cache.
const DurationPattern = `^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

// MaxInFlight bounds limit.inFlight (a key's slots in Redis: about 100 bytes each).
const MaxInFlight = 100_000

// Limit is a number of requests per window, or of requests in progress at once.
// +kubebuilder:validation:XValidation:rule="has(self.inFlight) ? !has(self.requests) && !has(self.window) && !has(self.burst) && !has(self.calendar) : has(self.requests) && (has(self.window) || has(self.calendar))",message="limit sets either requests and window (requests per window) or inFlight (requests in progress at once), not both: put each in a rule of its own"
// +kubebuilder:validation:XValidation:rule="!has(self.window) || !has(self.calendar)",message="limit sets either window (a rolling or fixed length) or calendar (days, weeks or months of a time zone), not both"
// +kubebuilder:validation:XValidation:rule="!has(self.queue) || has(self.inFlight)",message="limit.queue needs limit.inFlight: requests wait for a slot of an in-flight rule; a limit per window refuses at once"
// +kubebuilder:validation:XValidation:rule="!has(self.onSlotLost) || has(self.inFlight)",message="limit.onSlotLost needs limit.inFlight: only the requests of an in-flight rule hold a slot that can be lost"
type Limit struct {
	// requests admitted per window, at most 1000000000 (10000 for SlidingWindowLog). For
	// TokenBucket, the refill: requests tokens per window. Under a rule's cost.from: Response
	// these are units (such as tokens), not requests.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	Requests int64 `json:"requests,omitempty"`

	// window is the length of the window, between 1s and 24h (744h, 31 days, with
	// SlidingWindowCounter), in Go's duration syntax: numbers with units h, m, s, ms, us or ns,
	// such as 30s, 5m, 1h30m, 24h or 168h. For days, weeks or months of a calendar: calendar.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$')",message="limit.window must be a duration such as 30s, 5m, 1h30m or 24h, with units h, m, s, ms, us or ns; days and weeks are not units (write 24h for 1d, 168h for 7d), and calendar days, weeks and months are limit.calendar"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || (duration(self) >= duration('1s') && duration(self) <= duration('744h'))",message="limit.window must be between 1s and 744h (31 days; beyond 24h with algorithm SlidingWindowCounter only)"
	// +optional
	Window metav1.Duration `json:"window,omitzero"`

	// calendar makes the window a day, week or month of a time zone's calendar (FixedWindow
	// only), instead of window: requests per calendar period, reset at its start.
	// +optional
	Calendar *CalendarWindow `json:"calendar,omitempty"`

	// burst is the bucket size of a TokenBucket: how many requests may pass at once after a
	// quiet period. Defaults to requests. Only valid with TokenBucket.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	Burst *int64 `json:"burst,omitempty"`

	// inFlight is how many requests of a key may be in progress at once, over every replica,
	// at most 100000: a request holds a slot from its decision until its response ends
	// (streams and upgrades included), and one over the limit is refused at once with 429.
	// Instead of requests and window; the rule's algorithm does not apply. Enforced by the
	// sidecar's proxy, /v1/check (acquire, renew, release) and Envoy's rate limit service
	// (apply_on_stream_done): a slot of a sidecar that died returns within its expiry (10s),
	// never while a live sidecar renews it.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +optional
	InFlight *int64 `json:"inFlight,omitempty"`

	// queue, with inFlight only, lets a request of a full key wait for a slot instead of being
	// refused at once: in a queue of each key per sidecar, first come first served, at most
	// size requests, each for at most timeout; one that finds its key's queue full, or whose
	// timeout passes, is refused with 429 as without a queue. Through the sidecar's proxy
	// only: /v1/check and Envoy's rate limit service still answer at once.
	// +optional
	Queue *InFlightQueue `json:"queue,omitempty"`

	// onSlotLost, with inFlight only, says what the sidecar's proxy does with a request whose
	// slot is lost before it ends (not renewed before its expiry: Redis unreachable, the
	// sidecar frozen; or its place in Redis taken after a failover). End, the default, ends
	// the request: the key never has more than inFlight requests in progress. Finish lets it
	// run to its end, no longer counted: the key may then have more than inFlight requests
	// in progress until it ends.
	// +optional
	OnSlotLost SlotLostAction `json:"onSlotLost,omitempty"`
}
