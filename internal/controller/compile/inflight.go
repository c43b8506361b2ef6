package compile

import (
	"errors"
	"fmt"
	"time"

	"github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// compileInFlight compiles the limit of a rule that bounds the requests in progress at once
// (limit.inFlight). The schema refuses what goes with it; objects stored before it did meet the
// same checks here, with the same words.
func compileInFlight(r v1alpha1.Rule) (policydoc.Rule, error) {
	n := *r.Limit.InFlight
	switch {
	case n < 1 || n > v1alpha1.MaxInFlight:
		return policydoc.Rule{}, fmt.Errorf("limit.inFlight %d must be between 1 and %d", n, v1alpha1.MaxInFlight)
	case r.Limit.Requests != 0 || r.Limit.Window.Duration != 0 || r.Limit.Burst != nil || r.Limit.Calendar != nil:
		return policydoc.Rule{}, errors.New("limit sets either requests and window (requests per window) or inFlight (requests in progress at once), not both: put each in a rule of its own")
	case r.Cost != nil:
		return policydoc.Rule{}, errors.New("limit.inFlight cannot go with cost: an in-flight rule counts requests in progress, not what they cost; put the budget in a rule of its own")
	case r.Candidate != nil:
		return policydoc.Rule{}, errors.New("limit.inFlight cannot have a candidate (not supported yet); try the new limit as a rule of its own with mode: Shadow")
	case r.Refused != "":
		return policydoc.Rule{}, errors.New("limit.inFlight cannot go with refused: a slot always goes back when its request is refused or ends; leave refused unset")
	}
	queue, err := compileQueue(r.Limit.Queue)
	if err != nil {
		return policydoc.Rule{}, err
	}
	onLost, err := compileOnSlotLost(r.Limit.OnSlotLost)
	if err != nil {
		return policydoc.Rule{}, err
	}
	return policydoc.Rule{
		Name:         r.Name,
		InFlight:     n,
		Queue:        queue,
		OnSlotLost:   onLost,
		Mode:         string(orDefault(r.Mode, v1alpha1.Enforce)),
		ReportValues: r.TopKeys == v1alpha1.TopKeysValues,
	}, nil
}

// compileQueue compiles limit.queue (nil: none), with the schema's bounds and words.
func compileQueue(q *v1alpha1.InFlightQueue) (*policydoc.Queue, error) {
	if q == nil {
		return nil, nil
	}
	switch {
	case q.Size < 1 || q.Size > v1alpha1.MaxQueueSize:
		return nil, fmt.Errorf("limit.queue.size %d must be between 1 and %d", q.Size, v1alpha1.MaxQueueSize)
	case q.Timeout.Duration < time.Millisecond || q.Timeout.Duration > 10*time.Minute:
		return nil, errors.New("limit.queue.timeout must be between 1ms and 10m: a request waits no longer than that for a slot")
	}
	return &policydoc.Queue{Size: int64(q.Size), TimeoutMS: q.Timeout.Milliseconds()}, nil
}

// compileOnSlotLost compiles limit.onSlotLost: Finish is written, the default (End) left out so
// that a document of rules that end their requests stays readable by earlier sidecars.
func compileOnSlotLost(a v1alpha1.SlotLostAction) (string, error) {
	switch a {
	case "", v1alpha1.SlotLostEnd:
		return "", nil
	case v1alpha1.SlotLostFinish:
		return policydoc.SlotLostFinish, nil
	}
	return "", fmt.Errorf("limit.onSlotLost %q must be End or Finish", a)
}
