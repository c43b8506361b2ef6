package compile

import (
	"fmt"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// compileDurability compiles a rule's durability: nil for none, the mode and its timeout
// (resolved to its default) otherwise. It checks again what the schema checks, for objects
// stored before the field existed.
func compileDurability(r v1alpha1.Rule) (*policydoc.Durability, error) {
	d := r.Durability
	if d == nil {
		return nil, nil
	}
	var mode string
	switch d.Mode {
	case "", v1alpha1.DurabilityNone:
		return nil, nil
	case v1alpha1.DurabilityReplica:
		mode = policydoc.DurabilityReplica
	case v1alpha1.DurabilityAppendOnlyFile:
		mode = policydoc.DurabilityAppendOnlyFile
	default:
		return nil, fmt.Errorf("durability.mode %q must be None, Replica or AppendOnlyFile", d.Mode)
	}
	if r.Limit.InFlight != nil {
		return nil, fmt.Errorf("limit.inFlight cannot go with durability: a slot lives seconds and is re-asserted after a failover")
	}
	timeout := v1alpha1.DefaultDurabilityTimeout
	if d.Timeout != nil {
		timeout = d.Timeout.Duration
	}
	if timeout < v1alpha1.MinDurabilityTimeout || timeout > v1alpha1.MaxDurabilityTimeout {
		return nil, fmt.Errorf("durability.timeout %s must be between 1ms and 5s", timeout)
	}
	return &policydoc.Durability{Mode: mode, TimeoutMS: timeout.Milliseconds()}, nil
}
