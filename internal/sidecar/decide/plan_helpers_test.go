package decide_test

import (
	"context"
	"testing"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// decideReq plans rq against set (one unit a rule) and decides it, as the proxy does; a request
// the plan refuses (a repeated key header) panics: these tests send none.
func decideReq(ctx context.Context, e *decide.Engine, set *ruleset.Set, rq *decide.Request) decide.Decision {
	p, err := e.Plan(set, rq, 1)
	if err != nil {
		panic(err)
	}
	return e.Decide(ctx, &p)
}

// decideHits plans hits against set and decides them, as the decision API does.
func decideHits(ctx context.Context, e *decide.Engine, set *ruleset.Set, hits []decide.Hit, cost int64) (decide.Decision, error) {
	p, err := e.PlanHits(set, hits, cost)
	if err != nil {
		return decide.Decision{}, err
	}
	return e.Decide(ctx, &p), nil
}

// reserveReq plans rq against set (a cost of one for the plain rules) and reserves it, as the
// proxy does.
func reserveReq(ctx context.Context, e *decide.Engine, set *ruleset.Set, rq *decide.Request, need decide.Need) (decide.Decision, *decide.Holds, error) {
	p, err := e.Plan(set, rq, 1)
	if err != nil {
		return decide.Decision{}, nil, err
	}
	return e.Reserve(ctx, &p, need)
}

// acquireHits plans hits against set and takes their slots, as the decision API does.
func acquireHits(ctx context.Context, e *decide.Engine, set *ruleset.Set, hits []decide.Hit) (*decide.Slots, error) {
	p, err := e.PlanHits(set, hits, 1)
	if err != nil {
		return &decide.Slots{}, err
	}
	return e.AcquireSlots(ctx, &p), nil
}

// slotKey is the limiter key of rule of policy for key parts.
func slotKey(set *ruleset.Set, policy, rule string, parts ...string) string {
	key, _, _ := decide.HitKey(set, decide.Hit{Policy: policy, Rule: rule, Key: parts})
	return key
}

// acquireReq plans rq against set and takes its in-flight rules' slots, as the proxy does.
func acquireReq(ctx context.Context, e *decide.Engine, set *ruleset.Set, rq *decide.Request) *decide.Slots {
	p, err := e.Plan(set, rq, 1)
	if err != nil {
		panic(err)
	}
	return e.AcquireSlots(ctx, &p)
}

// buildSet is the rule set a sidecar builds from the document of policies in namespace.
func buildSet(t testing.TB, namespace string, policies []policydoc.Policy) *ruleset.Set {
	t.Helper()
	_, data, err := policydoc.Build(namespace, policies, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
