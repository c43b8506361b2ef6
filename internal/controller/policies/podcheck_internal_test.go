package policies

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

func testPod(name string, lbl map[string]string, ready bool, sidecar string) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: lbl, Annotations: map[string]string{"big": "x"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1", Args: []string{"--a"}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: status}, {Type: corev1.PodReady, Status: status}}
	switch sidecar {
	case "init":
		p.Spec.InitContainers = []corev1.Container{{Name: contract.ContainerName}}
	case "container":
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: contract.ContainerName})
	}
	return p
}

func TestPodsWithoutSidecarCountsReadySelectedPodsOnly(t *testing.T) {
	g := NewWithT(t)
	app := map[string]string{"app": "checkout"}
	other := map[string]string{"app": "search"}
	now := metav1.Now()
	deleting := testPod("deleting", app, true, "")
	deleting.DeletionTimestamp = &now
	done := testPod("done", app, true, "")
	done.Status.Phase = corev1.PodSucceeded
	pods := []corev1.Pod{
		testPod("e-bare", app, true, ""),
		testPod("a-bare", app, true, ""),
		testPod("native", app, true, "init"),
		testPod("classic", app, true, "container"),
		testPod("starting", app, false, ""),
		testPod("search", other, true, ""),
		testPod("d-bare", app, true, ""),
		testPod("c-bare", app, true, ""),
		deleting, done,
	}
	pol := func(sel map[string]string) *v1alpha1.RateLimitPolicy {
		return &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: metav1.LabelSelector{MatchLabels: sel}}}
	}
	got := podsWithoutSidecar([]*v1alpha1.RateLimitPolicy{pol(app), pol(other), pol(map[string]string{"app": "none"})}, pods)
	g.Expect(got[0].count).To(Equal(4))
	g.Expect(got[0].named).To(Equal([]string{"a-bare", "c-bare", "d-bare"}), "sorted, the first three")
	g.Expect(got[0].message()).To(HavePrefix("4 Ready pod(s) this policy selects run without the Redline sidecar, so their traffic is not limited: a-bare, c-bare, d-bare and 1 more."))
	g.Expect(got[1]).To(Equal(unguarded{count: 1, named: []string{"search"}}))
	g.Expect(got[2].count).To(BeZero())
}

func TestPodsWithoutSidecarBoundsThePairsChecked(t *testing.T) {
	g := NewWithT(t)
	pods := make([]corev1.Pod, 1000)
	for i := range pods {
		pods[i] = testPod("p", map[string]string{"app": "x"}, true, "")
	}
	policies := make([]*v1alpha1.RateLimitPolicy, 200)
	for i := range policies {
		policies[i] = &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}
	}
	got := podsWithoutSidecar(policies, pods)
	total := 0
	for _, u := range got {
		total += u.count
	}
	g.Expect(total).To(Equal(maxPodPairs), "200 policies x 1000 pods: only the first %d pairs are looked at", maxPodPairs)
	g.Expect(got[0].count).To(Equal(1000))
	g.Expect(got[len(got)-1].count).To(BeZero())
}

func TestSlimPodKeepsWhatTheCheckReads(t *testing.T) {
	g := NewWithT(t)
	for _, sidecar := range []string{"", "init", "container"} {
		p := testPod("p", map[string]string{"app": "checkout"}, true, sidecar)
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		before := p.DeepCopy()
		out, err := slimPod(&p)
		g.Expect(err).NotTo(HaveOccurred())
		s := out.(*corev1.Pod)
		g.Expect(s.Labels).To(Equal(before.Labels))
		g.Expect(s.Annotations).To(BeNil())
		g.Expect(s.ManagedFields).To(BeNil())
		g.Expect(s.Status.PodIP).To(BeEmpty())
		g.Expect(s.Status.Conditions).To(Equal([]corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}))
		g.Expect(podReady(s)).To(Equal(podReady(before)), sidecar)
		g.Expect(hasSidecar(s)).To(Equal(hasSidecar(before)), sidecar)
		g.Expect(hasSidecar(s)).To(Equal(sidecar != ""), sidecar)
		g.Expect(s.Spec.InitContainers).To(BeNil())
		g.Expect(len(s.Spec.Containers)).To(BeNumerically("<=", 1))
	}
}

func TestPodChangedLetsThroughWhatMatters(t *testing.T) {
	g := NewWithT(t)
	a := testPod("p", map[string]string{"app": "x"}, false, "")
	b := a.DeepCopy()
	b.ResourceVersion = "2"
	b.Status.PodIP = "10.0.0.2"
	g.Expect(podChanged.Update(updateEvent(&a, b))).To(BeFalse(), "a status change that is not readiness")
	b.Status.Conditions[1].Status = corev1.ConditionTrue
	g.Expect(podChanged.Update(updateEvent(&a, b))).To(BeTrue(), "readiness")
	c := a.DeepCopy()
	c.Labels = map[string]string{"app": "y"}
	g.Expect(podChanged.Update(updateEvent(&a, c))).To(BeTrue(), "labels")
}

func updateEvent(o, n *corev1.Pod) event.UpdateEvent {
	return event.UpdateEvent{ObjectOld: o, ObjectNew: n}
}

func TestSlimPodBoundsTheLabelsATenantWrites(t *testing.T) {
	g := NewWithT(t)
	labels := map[string]string{"app": "checkout"}
	for i := range 2000 {
		labels[fmt.Sprintf("pad-%04d", i)] = strings.Repeat("x", 63)
	}
	p := testPod("p", labels, true, "")
	out, err := slimPod(&p)
	g.Expect(err).NotTo(HaveOccurred())
	kept := out.(*corev1.Pod).Labels
	size := 0
	for k, v := range kept {
		size += len(k) + len(v)
	}
	g.Expect(size).To(BeNumerically("<=", maxPodLabelBytes))
	g.Expect(kept).To(HaveKeyWithValue("app", "checkout"), "kept by key order")
	small := testPod("q", map[string]string{"app": "x"}, true, "")
	out, _ = slimPod(&small)
	g.Expect(out.(*corev1.Pod).Labels).To(Equal(map[string]string{"app": "x"}))
}
