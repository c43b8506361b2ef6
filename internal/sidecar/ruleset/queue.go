package ruleset

import "time"

// Queue is how the proxy's requests of an in-flight rule's full key wait for a slot in this
// sidecar: at most Size of a key at once, first come first served, each at most Timeout.
type Queue struct {
	Size    int
	Timeout time.Duration
}
