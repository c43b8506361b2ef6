package policies

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// The namespace reconciler's status write keeps the budget reconciler's condition, even when it
// read the policy before that condition was written (a cache that lags).
func TestNamespaceStatusKeepsTheBudgetCondition(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	scheme := runtime.NewScheme()
	g.Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p", Generation: 1}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(p).WithStatusSubresource(p).Build()
	r := &NamespaceReconciler{Client: c}

	stale := &v1alpha1.RateLimitPolicy{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(p), stale)).To(Succeed())

	// The budget reconciler writes its condition after that read.
	fresh := stale.DeepCopy()
	meta.SetStatusCondition(&fresh.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionRedisConnectionBudget, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonWithinBudget, Message: "m",
	})
	g.Expect(c.Status().Patch(ctx, fresh, client.MergeFrom(stale))).To(Succeed())

	invalid := errors.New("bad spec")
	err := r.updateStatus(ctx, outcome{policy: stale.DeepCopy(), compileErr: invalid}, nil)
	g.Expect(err).To(MatchError(errStaleStatus), "a write from the stale read must be refused")

	got := &v1alpha1.RateLimitPolicy{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	g.Expect(meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionRedisConnectionBudget)).NotTo(BeNil())

	retry := got.DeepCopy()
	g.Expect(r.updateStatus(ctx, outcome{policy: retry, compileErr: invalid}, nil)).To(Succeed(), "the retry reads afresh")
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	g.Expect(got.Status.Conditions).To(ContainElements(
		HaveField("Type", v1alpha1.ConditionRedisConnectionBudget),
		HaveField("Type", v1alpha1.ConditionAccepted),
		HaveField("Type", v1alpha1.ConditionProgrammed)))
}
