package policydoc

import "fmt"

// Durability is what a rule's grants wait for before they are answered: a replica's
// acknowledgement (WAIT) or the master's fsynced append-only file (WAITAOF), each for at most
// TimeoutMS.
type Durability struct {
	// Mode is DurabilityReplica or DurabilityAppendOnlyFile.
	Mode      string `json:"mode"`
	TimeoutMS int64  `json:"timeoutMs"`
}

// The durability modes of a document; None is an absent Durability.
const (
	DurabilityReplica        = "Replica"
	DurabilityAppendOnlyFile = "AppendOnlyFile"
)

// MaxDurabilityTimeoutMS bounds Durability.TimeoutMS: a grant waiting longer would hold its
// request, and the connection it waits on, for longer than a client waits.
const MaxDurabilityTimeoutMS = 5000

// valid checks d, which may be nil (no durability).
func (d *Durability) valid() error {
	if d == nil {
		return nil
	}
	switch d.Mode {
	case DurabilityReplica, DurabilityAppendOnlyFile:
	default:
		return fmt.Errorf("mode %q must be %s or %s", d.Mode, DurabilityReplica, DurabilityAppendOnlyFile)
	}
	if d.TimeoutMS < 1 || d.TimeoutMS > MaxDurabilityTimeoutMS {
		return fmt.Errorf("timeout %dms not in 1..%dms", d.TimeoutMS, MaxDurabilityTimeoutMS)
	}
	return nil
}
