package policies

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/compile"
	"github.com/redline-dev/redline/internal/policydoc"
)

// testPolicy and compileAll give the document's tests compiled policies, as compile's own
// tests build them.
func testPolicy(name string, requests int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Generation: 3},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{
				MatchLabels: map[string]string{"app": "checkout"},
				MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "a"}},
					{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"dev"}},
				},
			},
			Rules: []v1alpha1.Rule{{
				Name: "r",
				Match: &v1alpha1.RuleMatch{
					PathPrefix: "/api/", Methods: []v1alpha1.HTTPMethod{"POST", "GET"},
					Headers: []v1alpha1.HeaderMatch{{Name: "X-B"}, {Name: "X-A"}},
				},
				Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}, {Attribute: v1alpha1.Method}},
				Limit: v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
}

func compileAll(t *testing.T, ps ...*v1alpha1.RateLimitPolicy) []policydoc.Policy {
	t.Helper()
	var out []policydoc.Policy
	for _, p := range ps {
		c, err := compile.Policy(p)
		if err != nil {
			t.Fatalf("compiling %s: %v", p.Name, err)
		}
		out = append(out, c)
	}
	return out
}
