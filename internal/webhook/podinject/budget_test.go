package podinject

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

func controllerRef(kind, name string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: "u", Controller: new(true)}}
}

// budgetPod is a pod at admission: a generateName and its controller, no name yet.
func budgetPod(ownerKind, owner string, kv ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", GenerateName: owner + "-", Annotations: map[string]string{
			contract.AnnotationInject: "true", contract.AnnotationUpstreamPort: "8080",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	if ownerKind != "" {
		pod.OwnerReferences = controllerRef(ownerKind, owner)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		pod.Annotations[kv[i]] = kv[i+1]
	}
	return pod
}

func poolArg(g Gomega, pod *corev1.Pod) string {
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != contract.ContainerName {
			continue
		}
		for _, a := range c.Args {
			if len(a) > len("--redis-pool-size=") && a[:len("--redis-pool-size=")] == "--redis-pool-size=" {
				return a[len("--redis-pool-size="):]
			}
		}
		return ""
	}
	g.Expect(pod.Spec.Containers).To(ContainElement(HaveField("Name", contract.ContainerName)), "no sidecar injected")
	return ""
}

// blockingReader answers nothing until its context ends, like an API server that hangs.
type blockingReader struct{ client.Reader }

func (blockingReader) Get(ctx context.Context, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestPoolFromBudget(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	checkout := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)},
	}
	checkoutRS := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout-5d8f", OwnerReferences: controllerRef("Deployment", "checkout")}}
	bare := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "bare"}, Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](40)}}
	ledger := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "ledger"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](4)}}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout"},
			MaxReplicas:    30,
		},
	}
	// The cache has not seen checkout's new ReplicaSet yet; the API server has.
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(checkout, bare, ledger, hpa).Build()
	direct := fake.NewClientBuilder().WithScheme(scheme).WithObjects(checkout, checkoutRS, bare, ledger, hpa).Build()

	// maxclients 200, reserve 4 + 10, two workloads counted: a share of 93 each.
	counted := map[connbudget.Workload]struct{}{
		{Kind: "Deployment", Namespace: "shop", Name: "checkout"}: {},
		{Kind: "StatefulSet", Namespace: "shop", Name: "ledger"}:  {},
	}
	budget := &connbudget.Publisher{}
	budget.Publish(&connbudget.Snapshot{MaxClients: 200, Reserve: 14, Workloads: counted})
	cfg := DefaultConfig()
	cfg.SidecarImage = "sidecar:test"
	injector := func(cache client.Reader) *Injector {
		in := NewInjector(cfg, true)
		in.cfg.Budget = budget
		in.sizer = &poolSizer{cache: cache, direct: direct, timeout: 200 * time.Millisecond, log: log.Log}
		return in
	}

	tests := []struct {
		name     string
		pod      *corev1.Pod
		cache    client.Reader
		wantPool string
		warn     []string
	}{
		{name: "Deployment with an HPA: 93 / 30", pod: budgetPod("ReplicaSet", "checkout-5d8f"), wantPool: "3"},
		{name: "StatefulSet without an HPA: 93 / 4, capped at the default", pod: budgetPod("StatefulSet", "ledger"), wantPool: "16"},
		{name: "ReplicaSet without a Deployment, not counted yet: 186 / 3 / 40", pod: budgetPod("ReplicaSet", "bare"), wantPool: "2"},
		{name: "the annotation wins, within the share: 3 x 30 = 90", pod: budgetPod("ReplicaSet", "checkout-5d8f", contract.AnnotationRedisPoolSize, "3"), wantPool: "3"},
		{
			name:     "the annotation wins, with a warning when it overspends: 8 x 30 = 240",
			pod:      budgetPod("ReplicaSet", "checkout-5d8f", contract.AnnotationRedisPoolSize, "8"),
			wantPool: "8",
			warn: []string{"redline: redline.dev/redis-pool-size=8 x maxReplicas 30 = 240 connections per Redis node, more than Deployment shop/checkout's " +
				"even share of Redis's connection budget, 93; without the annotation its pods would get 3"},
		},
		{name: "a bare pod: the default", pod: budgetPod("", "solo")},
		{name: "a Job's pod: the default", pod: func() *corev1.Pod {
			p := budgetPod("", "job")
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "job", UID: "u", Controller: new(true)}}
			return p
		}()},
		{name: "owner missing everywhere: the default", pod: budgetPod("ReplicaSet", "gone")},
		{name: "a hanging API server: the default, within the timeout", pod: budgetPod("ReplicaSet", "checkout-5d8f"), cache: blockingReader{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			cache := tt.cache
			if cache == nil {
				cache = cached
			}
			start := time.Now()
			out, warns, err := injector(cache).Inject(context.Background(), tt.pod)
			g.Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second), "admission must not wait on lookups")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(poolArg(g, out)).To(Equal(tt.wantPool))
			g.Expect(warns).To(Equal(tt.warn))
		})
	}

	t.Run("no budget read yet: the default, no lookups", func(t *testing.T) {
		g := NewWithT(t)
		in := NewInjector(cfg, true)
		in.cfg.Budget = &connbudget.Publisher{}
		in.sizer = &poolSizer{cache: blockingReader{}, log: log.Log}
		out, warns, err := in.Inject(context.Background(), budgetPod("ReplicaSet", "checkout-5d8f"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(warns).To(BeEmpty())
		g.Expect(poolArg(g, out)).To(BeEmpty())
	})

	// The manager's --sidecar-redis-pool-size: the ceiling the budget sizes within (the
	// reconciler publishes it in the snapshot) and the pool of pods it cannot size.
	t.Run("the manager's pool default", func(t *testing.T) {
		withCeiling := cfg
		withCeiling.SidecarRedisPoolSize = 40
		ceiling := &connbudget.Publisher{}
		ceiling.Publish(&connbudget.Snapshot{MaxClients: 200, Reserve: 14, Workloads: counted, PoolCeiling: 40})
		for _, tt := range []struct {
			name     string
			budget   *connbudget.Publisher
			pod      *corev1.Pod
			wantPool string
		}{
			{name: "StatefulSet without an HPA: 93 / 4, capped at the manager's 40 instead of 16", budget: ceiling, pod: budgetPod("StatefulSet", "ledger"), wantPool: "23"},
			{name: "Deployment with an HPA: 93 / 30 as before", budget: ceiling, pod: budgetPod("ReplicaSet", "checkout-5d8f"), wantPool: "3"},
			{name: "a bare pod: the manager's default", budget: ceiling, pod: budgetPod("", "solo"), wantPool: "40"},
			{name: "no budget read yet: the manager's default", budget: &connbudget.Publisher{}, pod: budgetPod("ReplicaSet", "checkout-5d8f"), wantPool: "40"},
			{name: "the annotation still wins", budget: ceiling, pod: budgetPod("", "solo", contract.AnnotationRedisPoolSize, "5"), wantPool: "5"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				g := NewWithT(t)
				in := NewInjector(withCeiling, true)
				in.cfg.Budget = tt.budget
				in.sizer = &poolSizer{cache: cached, direct: direct, timeout: time.Second, log: log.Log}
				out, _, err := in.Inject(context.Background(), tt.pod)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(poolArg(g, out)).To(Equal(tt.wantPool))
			})
		}
	})
}
