package decide_test

import (
	"testing"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// Explain covers every rule a request can meet, the in-flight ones included, under the key
// each counts the request under: the slots' key for an in-flight rule.
func TestExplainCoversInFlightRules(t *testing.T) {
	inFlight := policydoc.Rule{Name: "busy", Key: []policydoc.KeyPart{{Header: "X-Org"}}, InFlight: 4, Mode: "Enforce"}
	set := stackedSet(t, stackedRule("user", "X-User", "FixedWindow", 10), inFlight)
	xs := (&decide.Engine{}).Explain(set, stackedReq("ann", "acme"))
	if len(xs) != 2 {
		t.Fatalf("%d explanations, want the window rule and the in-flight rule", len(xs))
	}
	if xs[0].Rule.Name != "user" || xs[1].Rule.Name != "busy" {
		t.Fatalf("rules %q, %q: want user then busy", xs[0].Rule.Name, xs[1].Rule.Name)
	}
	x := xs[1]
	if x.Rule.InFlight == nil || !x.Matches {
		t.Fatalf("the in-flight rule: %+v, want a matching in-flight rule", x)
	}
	if want, _, _ := decide.HitKey(set, decide.Hit{Policy: x.Rule.Policy.Name, Rule: x.Rule.Name, Key: []string{"acme"}}); x.Key != want {
		t.Fatalf("in-flight key %q, want the slots' key %q", x.Key, want)
	}
	if x.Hash != keyscheme.Hash(x.Key) || x.Hash == "" {
		t.Fatalf("hash %q of key %q", x.Hash, x.Key)
	}
}
