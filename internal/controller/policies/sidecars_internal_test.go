package policies

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
)

// The Enforced condition comes from counts and a few names, whatever the group held.
func TestEnforcedFromSummaries(t *testing.T) {
	const hash = "0123456789abcdef0123"
	for _, tc := range []struct {
		name   string
		e      enforcement
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		{"not written", enforcement{unwritten: true}, metav1.ConditionUnknown, v1alpha1.ReasonNotWritten, "not read"},
		{"redis down", enforcement{err: errors.New("refused")}, metav1.ConditionUnknown, v1alpha1.ReasonRedisUnavailable, "refused"},
		{"over the bound", enforcement{report: fleet.Summary{Live: 12000, OverBound: true, Bound: 10000}},
			metav1.ConditionUnknown, v1alpha1.ReasonSidecarReportsOverBound, "12000 live sidecars report for this policy, more than the 2000 heartbeats the manager reads of one policy, or than were left of the 10000"},
		{"none", enforcement{}, metav1.ConditionUnknown, v1alpha1.ReasonNoSidecars, "no live sidecar"},
		{"all current", enforcement{report: fleet.Summary{Live: 3, Read: 3, Current: 3}},
			metav1.ConditionTrue, v1alpha1.ReasonEnforced, "3 of 3 live sidecars apply configuration 0123456789ab"},
		{"some stale", enforcement{report: fleet.Summary{Live: 3, Read: 3, Current: 2, Stale: []string{"pod-c"}}},
			metav1.ConditionFalse, v1alpha1.ReasonPropagating, "2 of 3 live sidecars apply configuration 0123456789ab; still on an older one: [pod-c]"},
		{"more stale than named", enforcement{report: fleet.Summary{Live: 9, Read: 9, Current: 2, Stale: []string{"a", "b", "c", "d", "e"}}},
			metav1.ConditionFalse, v1alpha1.ReasonPropagating, "2 of 9 live sidecars apply configuration 0123456789ab; still on an older one: [a b c d e ...]"},
		{"started after the count", enforcement{report: fleet.Summary{Live: 4, Read: 3, Current: 3}},
			metav1.ConditionFalse, v1alpha1.ReasonPropagating, "3 of 4 live sidecars apply configuration 0123456789ab; still on an older one: [...]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			status, reason, msg := tc.e.condition(hash)
			g.Expect(status).To(Equal(tc.status))
			g.Expect(reason).To(Equal(tc.reason))
			g.Expect(msg).To(ContainSubstring(tc.msg))
		})
	}
}
