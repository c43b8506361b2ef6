package compile

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

func TestCompileDurability(t *testing.T) {
	g := NewWithT(t)
	r := v1alpha1.Rule{Limit: v1alpha1.Limit{Requests: 1, Window: metav1.Duration{Duration: time.Minute}}}
	d, err := compileDurability(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(BeNil())
	r.Durability = &v1alpha1.Durability{Mode: v1alpha1.DurabilityReplica}
	d, err = compileDurability(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Mode).To(Equal("Replica"))
	g.Expect(d.TimeoutMS).To(BeEquivalentTo(100), "the default timeout")
	r.Durability.Timeout = &metav1.Duration{Duration: 6 * time.Second}
	_, err = compileDurability(r)
	g.Expect(err).To(MatchError(ContainSubstring("between 1ms and 5s")))
	inFlight := int64(3)
	r.Durability.Timeout, r.Limit = nil, v1alpha1.Limit{InFlight: &inFlight}
	_, err = compileDurability(r)
	g.Expect(err).To(MatchError(ContainSubstring("limit.inFlight cannot go with durability")))
}
