package compile

import (
	"errors"
	"fmt"

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
	return policydoc.Rule{
		Name:         r.Name,
		InFlight:     n,
		Mode:         string(orDefault(r.Mode, v1alpha1.Enforce)),
		ReportValues: r.TopKeys == v1alpha1.TopKeysValues,
	}, nil
}
