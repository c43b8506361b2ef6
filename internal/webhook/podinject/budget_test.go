package podinject

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
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

// envKey is the ConfigMap key the sidecar's variable name is read from, "" when it has none.
func envKey(g Gomega, pod *corev1.Pod, name string) string {
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != contract.ContainerName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == name {
				ref := e.ValueFrom.ConfigMapKeyRef
				g.Expect(ref.Name).To(Equal(RedisConfigMapName))
				g.Expect(ref.Optional).To(HaveValue(BeTrue()), "the key is written after the first pods may start")
				return ref.Key
			}
		}
	}
	return ""
}

// withHash gives a pod the label a Deployment's pods carry, as ReplicaSet checkout-5d8f's.
func withHash(pod *corev1.Pod) *corev1.Pod {
	pod.Labels = map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: "5d8f"}
	return pod
}

// The manager writes each injected workload's pool and replicas in its namespace's ConfigMap,
// sized as the budget reconciler counts them.
func TestWorkloadDataSizesPoolsFromTheBudget(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	injected := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{contract.AnnotationInject: "true"}}}
	explicit := *injected.DeepCopy()
	explicit.Annotations[contract.AnnotationRedisPoolSize] = "8"
	objs := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Template: injected}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout-5d8f", OwnerReferences: controllerRef("Deployment", "checkout")},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](2), Template: injected}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "bare"}, Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](40), Template: injected}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "ledger"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](4), Template: injected}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "own-pool"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](5), Template: explicit}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "plain"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3)}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "idle"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Template: injected}},
		&autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout"},
				MaxReplicas:    30,
			},
		},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	// maxclients 200, reserve 4 + 10, two workloads counted: a share of 93 each.
	snap := &connbudget.Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[connbudget.Workload]struct{}{
		{Kind: "Deployment", Namespace: "shop", Name: "checkout"}: {},
		{Kind: "StatefulSet", Namespace: "shop", Name: "ledger"}:  {},
	}}

	data, err := workloadData(context.Background(), c, "shop", false, snap)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(Equal(map[string]string{
		"pool-size.deployment.checkout": "3", "replicas.deployment.checkout": "30", // 93 / maxReplicas 30
		"pool-size.statefulset.ledger": "16", "replicas.statefulset.ledger": "4", // 93 / 4, capped at the default
		"pool-size.replicaset.bare": "2", "replicas.replicaset.bare": "40", // not counted yet: 186 / 3 / 40
		"replicas.statefulset.own-pool": "5", // its annotation is its pool
	}))

	// Redis's maxclients unknown: the replicas only.
	data, err = workloadData(context.Background(), c, "shop", false, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(HaveKeyWithValue("replicas.deployment.checkout", "30"))
	g.Expect(data).NotTo(HaveKey("pool-size.deployment.checkout"))

	// A namespace that opts its pods in: the plain Deployment too.
	data, err = workloadData(context.Background(), c, "shop", true, snap)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(HaveKeyWithValue("replicas.deployment.plain", "3"))
}

// A tenant with more workloads than MaxWorkloadKeys gets keys for the first ones by kind and
// name; the rest run on the defaults, and the ConfigMap stays bounded.
func TestWorkloadDataIsBounded(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	injected := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{contract.AnnotationInject: "true"}}}
	b := fake.NewClientBuilder().WithScheme(scheme)
	for i := range MaxWorkloadKeys + 100 {
		b = b.WithObjects(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: fmt.Sprintf("d%04d-%s", i, strings.Repeat("x", 240))},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Template: injected}})
	}
	data, err := workloadData(context.Background(), b.Build(), "big", false, &connbudget.Snapshot{MaxClients: 100000, Reserve: 14})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(HaveLen(2 * MaxWorkloadKeys))
	size := 0
	for k, v := range data {
		g.Expect(validation.IsConfigMapKey(k)).To(BeEmpty())
		size += len(k) + len(v)
	}
	g.Expect(size).To(BeNumerically("<", 1<<19), "far below a ConfigMap's 1 MiB")
	g.Expect(data).To(HaveKey(workloadKey(ReplicasKeyPrefix, "Deployment", fmt.Sprintf("d%04d-%s", 0, strings.Repeat("x", 240)))))
	g.Expect(data).NotTo(HaveKey(workloadKey(ReplicasKeyPrefix, "Deployment", fmt.Sprintf("d%04d-%s", MaxWorkloadKeys, strings.Repeat("x", 240)))))
}

// The patch names the pod's own workload's keys, derived from what the review sent, and
// carries no pool or replica count; the annotation's pool is the pod's own.
func TestPatchNamesTheWorkloadKeysOnly(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	checkout := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}
	checkoutRS := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout-5d8f", OwnerReferences: controllerRef("Deployment", "checkout")}}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout"},
			MaxReplicas:    30,
		},
	}
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(checkout, checkoutRS, hpa).Build()
	budget := &connbudget.Publisher{}
	budget.Publish(&connbudget.Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[connbudget.Workload]struct{}{
		{Kind: "Deployment", Namespace: "shop", Name: "checkout"}: {}, {Kind: "StatefulSet", Namespace: "shop", Name: "ledger"}: {},
	}})
	cfg := DefaultConfig()
	cfg.SidecarImage = "sidecar:test"
	injector := func(cfg Config, verified bool) *Injector {
		in := NewInjector(cfg, true)
		in.cfg.Budget = budget
		in.sizer = &poolSizer{cache: cached, direct: cached, timeout: time.Second, log: log.Log, verifiedClients: verified}
		return in
	}
	overspend := []string{"redline: redline.dev/redis-pool-size=8 x maxReplicas 30 = 240 connections per Redis node, more than Deployment shop/checkout's " +
		"even share of Redis's connection budget, 93; without the annotation its pods would get 3"}
	withDefault := cfg
	withDefault.SidecarRedisPoolSize = 40

	for _, tt := range []struct {
		name                    string
		cfg                     Config
		verified                bool
		pod                     *corev1.Pod
		wantPool                string
		wantPoolKey, wantRepKey string
		warn                    []string
	}{
		{name: "a Deployment's pod", pod: withHash(budgetPod("ReplicaSet", "checkout-5d8f")),
			wantPoolKey: "pool-size.deployment.checkout", wantRepKey: "replicas.deployment.checkout"},
		{name: "a StatefulSet's pod", pod: budgetPod("StatefulSet", "ledger"),
			wantPoolKey: "pool-size.statefulset.ledger", wantRepKey: "replicas.statefulset.ledger"},
		{name: "a ReplicaSet's pod without the Deployment's label", pod: budgetPod("ReplicaSet", "bare"),
			wantPoolKey: "pool-size.replicaset.bare", wantRepKey: "replicas.replicaset.bare"},
		{name: "a forged owner no key can name: hashed", pod: budgetPod("StatefulSet", "a/b"),
			wantPoolKey: workloadKey(PoolSizeKeyPrefix, "StatefulSet", "a/b"), wantRepKey: workloadKey(ReplicasKeyPrefix, "StatefulSet", "a/b")},
		{name: "a bare pod: no keys", pod: budgetPod("", "solo")},
		{name: "the manager's default as the flag, the budget's key over it", cfg: withDefault, pod: withHash(budgetPod("ReplicaSet", "checkout-5d8f")),
			wantPool: "40", wantPoolKey: "pool-size.deployment.checkout", wantRepKey: "replicas.deployment.checkout"},
		{name: "the annotation wins: no pool key, no warning to an unverified caller",
			pod: withHash(budgetPod("ReplicaSet", "checkout-5d8f", contract.AnnotationRedisPoolSize, "8")), wantPool: "8", wantRepKey: "replicas.deployment.checkout"},
		{name: "the annotation's overspend, told when only the API server can call", verified: true,
			pod: withHash(budgetPod("ReplicaSet", "checkout-5d8f", contract.AnnotationRedisPoolSize, "8")), wantPool: "8", wantRepKey: "replicas.deployment.checkout", warn: overspend},
		{name: "the annotation within its share: no warning", verified: true,
			pod: withHash(budgetPod("ReplicaSet", "checkout-5d8f", contract.AnnotationRedisPoolSize, "3")), wantPool: "3", wantRepKey: "replicas.deployment.checkout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := tt.cfg
			if c.SidecarImage == "" {
				c = cfg
			}
			out, warns, err := injector(c, tt.verified).Inject(context.Background(), tt.pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(poolArg(g, out)).To(Equal(tt.wantPool))
			g.Expect(envKey(g, out, contract.EnvBudgetRedisPoolSize)).To(Equal(tt.wantPoolKey))
			g.Expect(envKey(g, out, contract.EnvFallbackReplicas)).To(Equal(tt.wantRepKey))
			g.Expect(warns).To(Equal(tt.warn))
		})
	}
}
