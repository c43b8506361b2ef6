package budget

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func TestNamespaceBudgetSummary(t *testing.T) {
	load := func(ns, name string, replicas, pool int64) workloadLoad {
		return workloadLoad{Ref: workloadRef{Kind: "Deployment", Namespace: ns, Name: name}, Replicas: replicas, Pool: pool}
	}
	tests := []struct {
		name  string
		loads []workloadLoad
		share int64
		over  bool
		want  string
	}{{
		name:  "largest first, thousands separated",
		loads: []workloadLoad{{Ref: workloadRef{Kind: "StatefulSet", Namespace: "shop", Name: "cart"}, Replicas: 50, Pool: 200}, load("shop", "checkout", 50, 16), load("shop", "search", 20, 16)},
		share: 10000,
		over:  true,
		want:  "namespace shop's worst case 11,120 connections per Redis node at maxReplicas (statefulset cart 50 x 200, deployment checkout 50 x 16, deployment search 20 x 16), over its share of Redis's connections, 10,000",
	}, {
		name:  "exactly at the share is within",
		loads: []workloadLoad{load("a", "x", 6, 16)},
		share: 96,
		want:  "namespace a's worst case 96 connections per Redis node at maxReplicas (deployment x 6 x 16), within its share of Redis's connections, 96",
	}, {
		name: "more than five workloads: the rest are counted",
		loads: []workloadLoad{load("a", "a1", 1, 2), load("a", "a2", 1, 2), load("a", "a3", 1, 2),
			load("a", "a4", 1, 2), load("a", "a5", 1, 2), load("a", "a6", 1, 2), load("a", "a7", 1, 2)},
		share: 10,
		over:  true,
		want:  "namespace a's worst case 14 connections per Redis node at maxReplicas (deployment a1 1 x 2, deployment a2 1 x 2, deployment a3 1 x 2, deployment a4 1 x 2, deployment a5 1 x 2, 2 more), over its share of Redis's connections, 10",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			nb := namespaceBudget{Namespace: tt.loads[0].Ref.Namespace, Workloads: tt.loads, Share: tt.share}
			g.Expect(nb.Summary()).To(Equal(tt.want))
			g.Expect(nb.Over()).To(Equal(tt.over))
		})
	}
}

// Issue 18: the condition named the five largest workloads of the cluster, other tenants'
// included, and carried the cluster's total. Each namespace's budget names only its own, and
// another namespace's growth does not change its message.
func TestNamespaceBudgetsNameOnlyTheirOwn(t *testing.T) {
	g := NewWithT(t)
	load := func(ns, name string, replicas int64) workloadLoad {
		return workloadLoad{Ref: workloadRef{Kind: "Deployment", Namespace: ns, Name: name}, Replicas: replicas,
			PodLabels: map[string]string{"app": name}}
	}
	maxClients := int64(1000)
	r := &Reconciler{ManagerConnections: 4}
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "p"},
		Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}}
	messages := func(attackerReplicas int64) (string, string) {
		loads := []workloadLoad{load("victim", "api", 50), load("attacker", "huge", attackerReplicas), load("attacker", "big", 400)}
		snap := r.snapshot(maxClients, loads)
		sizePools(loads, snap)
		b := newBudget(loads, 4, snap)
		_, _, msg := budgetCondition(p, b.Namespaces()["victim"], nil)
		return msg, b.Namespaces()["victim"].Summary()
	}
	msg, summary := messages(100000)
	for _, s := range []string{msg, summary} {
		g.Expect(s).NotTo(ContainSubstring("attacker"))
		g.Expect(s).NotTo(ContainSubstring("huge"))
	}
	g.Expect(msg).To(ContainSubstring("Deployment victim/api 50 x 9"), "(1,000 - 54) / 2 namespaces / 50 replicas")
	again, _ := messages(1000000)
	g.Expect(again).To(Equal(msg), "the attacker's maxReplicas changes nothing in the victim's status")
}

func TestPoolSizeAnnotation(t *testing.T) {
	g := NewWithT(t)
	pool, explicit := poolSize(nil, 16)
	g.Expect(explicit).To(BeFalse(), "no annotation: the budget sizes the pool")
	g.Expect(pool).To(BeZero())
	pool, explicit = poolSize(map[string]string{"redline.dev/redis-pool-size": "4"}, 16)
	g.Expect(explicit).To(BeTrue())
	g.Expect(pool).To(Equal(int64(4)))
	// The injector refuses these; the count stays on the safe side with the largest pool the
	// injector gives, the manager's ceiling.
	for _, bad := range []string{"1", "lots"} {
		pool, explicit = poolSize(map[string]string{"redline.dev/redis-pool-size": bad}, 16)
		g.Expect(explicit).To(BeTrue())
		g.Expect(pool).To(Equal(int64(16)), bad)
		pool, _ = poolSize(map[string]string{"redline.dev/redis-pool-size": bad}, 48)
		g.Expect(pool).To(Equal(int64(48)), bad)
	}
}

// With the manager's --sidecar-redis-pool-size, the reconciler sizes pools up to it and counts
// it where nothing can be sized, and the snapshot it publishes gives the injector the same.
func TestSizePoolsCountsTheManagersCeiling(t *testing.T) {
	g := NewWithT(t)
	load := func(name string, replicas, pool int64) workloadLoad {
		return workloadLoad{Ref: workloadRef{Kind: "Deployment", Namespace: "shop", Name: name}, Replicas: replicas, Pool: pool, Explicit: pool > 0}
	}
	for _, tt := range []struct {
		ceiling int64
		want    []int64
	}{
		// (10,000 - 504) / 4 = 2,374 each: checkout 2,374 / 500, search / 200, reports / 75.
		{0, []int64{4, 11, 16, 32}},
		{64, []int64{4, 11, 31, 32}},
		{8, []int64{4, 8, 8, 32}},
	} {
		maxClients := int64(10000)
		r := &Reconciler{ManagerConnections: 4, PoolCeiling: tt.ceiling}
		loads := []workloadLoad{load("checkout", 500, 0), load("search", 200, 0), load("reports", 75, 0), load("pinned", 10, 32)}
		snap := r.snapshot(maxClients, loads)
		sizePools(loads, snap)
		g.Expect([]int64{loads[0].Pool, loads[1].Pool, loads[2].Pool, loads[3].Pool}).To(Equal(tt.want), "ceiling %d", tt.ceiling)
		for _, w := range loads[:3] {
			g.Expect(w.Pool).To(Equal(snap.PoolSize(w.Ref, w.Replicas)), "what the injector gives from the published snapshot")
		}
		b := newBudget(loads, 4, snap)
		g.Expect(b.WorstCase()).To(Equal(500*tt.want[0] + 200*tt.want[1] + 75*tt.want[2] + 10*tt.want[3] + 4))

		maxClients = 0
		unknown := []workloadLoad{load("checkout", 500, 0)}
		sizePools(unknown, r.snapshot(maxClients, unknown))
		want := tt.ceiling
		if want == 0 {
			want = 16
		}
		g.Expect(unknown[0].Pool).To(Equal(want), "maxclients unknown: the injector gives the ceiling, and it is counted")
	}
}

// What the reconciler counts for a workload without the annotation is what the injector
// injects: connbudget.PoolSize over the same snapshot.
func TestSizePoolsCountsWhatTheInjectorInjects(t *testing.T) {
	g := NewWithT(t)
	maxClients := int64(10000)
	r := &Reconciler{ManagerConnections: 4}
	load := func(name string, replicas, pool int64) workloadLoad {
		return workloadLoad{Ref: workloadRef{Kind: "Deployment", Namespace: "shop", Name: name}, Replicas: replicas, Pool: pool, Explicit: pool > 0}
	}
	loads := []workloadLoad{load("checkout", 500, 0), load("search", 200, 0), load("reports", 75, 0), load("pinned", 10, 32)}
	snap := r.snapshot(maxClients, loads)
	sizePools(loads, snap)
	g.Expect(snap.Reserve).To(Equal(int64(504)))
	g.Expect(snap.Workloads).To(HaveLen(4))
	// (10,000 - 504) / 4 = 2,374 each.
	g.Expect(loads).To(HaveEach(HaveField("Pool", BeNumerically(">=", 2))))
	g.Expect([]int64{loads[0].Pool, loads[1].Pool, loads[2].Pool, loads[3].Pool}).To(Equal([]int64{4, 11, 16, 32}))
	for _, w := range loads[:3] {
		g.Expect(w.Pool).To(Equal(snap.PoolSize(w.Ref, w.Replicas)))
	}
	b := newBudget(loads, 4, snap)
	g.Expect(b.WorstCase()).To(Equal(int64(500*4 + 200*11 + 75*16 + 10*32 + 4)))
	g.Expect(b.Namespaces()["shop"].Over()).To(BeFalse())

	maxClients = 0
	unknown := []workloadLoad{load("checkout", 500, 0)}
	sizePools(unknown, r.snapshot(maxClients, unknown))
	g.Expect(unknown[0].Pool).To(Equal(int64(16)), "maxclients unknown: the sidecar's default")
}

// A cluster is read on every master, and the smallest maxclients is the budget: every sidecar
// holds its pool on each of them.
func TestRedisClientsEveryMaster(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartCluster(3)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(cl.Close()).To(Succeed()) }()
	for i, addr := range cl.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		g.Expect(c.ConfigSet(context.Background(), "maxclients", fmt.Sprint(1000+i*500)).Err()).To(Succeed())
		g.Expect(c.Close()).To(Succeed())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer func() { _ = cc.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes, err := (&RedisClients{Client: cc}).Nodes(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(nodes).To(HaveLen(3))
	g.Expect(minMaxClients(nodes)).To(Equal(int64(1000)))
	for _, n := range nodes {
		g.Expect(n.Connected).To(BeNumerically(">=", 1), "this client's own connection to %s", n.Addr)
	}
}

// Managed Redis services often refuse CONFIG: the error says which flag gives maxclients, and
// with it connected_clients is still read.
func TestRedisClientsWithoutConfig(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start("--rename-command", "CONFIG", "")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(srv.Close()).To(Succeed()) }()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = c.Close() }()
	ctx := context.Background()

	_, err = (&RedisClients{Client: c}).Nodes(ctx)
	g.Expect(err).To(MatchError(ContainSubstring("--redis-maxclients")))

	nodes, err := (&RedisClients{Client: c, MaxClients: 500}).Nodes(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(nodes).To(ConsistOf(HaveField("MaxClients", int64(500))))
	g.Expect(nodes[0].Connected).To(BeNumerically(">=", 1))
}

// Every replica publishes the budget for its own webhook; only the leader writes status.
func TestBudgetOnFollowers(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start("--maxclients", "300")
	g.Expect(err).NotTo(HaveOccurred())
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.Close()
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer func() { _ = rdb.Close() }()

	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	labels := map[string]string{"app": "checkout"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](20), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
			Labels: labels, Annotations: map[string]string{contract.AnnotationInject: "true"},
		}}},
	}
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p"},
		Spec:       v1alpha1.RateLimitPolicySpec{TargetSelector: metav1.LabelSelector{MatchLabels: labels}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d, p).WithStatusSubresource(p).Build()
	elected := make(chan struct{})
	// The manager's Redis, in a registry that reads RedisBackends as production's does.
	def := backend.New("", "", rdb, nil, nil, 0, time.Minute, nil)
	budget := def.Budget
	r := &Reconciler{
		Client: c, Backends: backend.NewRegistry(def, c), ManagerConnections: 4, Elected: elected,
	}
	budgetCondition := func() *metav1.Condition {
		got := &v1alpha1.RateLimitPolicy{}
		g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(p), got)).To(Succeed())
		return meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionRedisConnectionBudget)
	}

	_, err = r.Reconcile(context.Background(), budgetRequest)
	g.Expect(err).NotTo(HaveOccurred())
	snap := budget.Load()
	g.Expect(snap.Known()).To(BeTrue())
	g.Expect(snap.MaxClients).To(Equal(int64(300)))
	g.Expect(snap.Reserve).To(Equal(int64(4 + 15)))
	g.Expect(snap.Workloads).To(HaveKey(connbudget.Workload{Kind: "Deployment", Namespace: "shop", Name: "checkout"}))
	g.Expect(snap.PoolSize(connbudget.Workload{Kind: "Deployment", Namespace: "shop", Name: "checkout"}, 20)).To(Equal(int64(14)))
	g.Expect(budgetCondition()).To(BeNil(), "a follower writes no status")

	close(elected)
	_, err = r.Reconcile(context.Background(), budgetRequest)
	g.Expect(err).NotTo(HaveOccurred())
	cond := budgetCondition()
	g.Expect(cond).NotTo(BeNil(), "the leader writes status")
	g.Expect(cond.Message).To(HaveSuffix("Deployment shop/checkout 20 x 14"))

	// Redis gone: the last maxclients read is kept for the injector.
	g.Expect(srv.Close()).To(Succeed())
	stopped = true
	_, err = r.Reconcile(context.Background(), budgetRequest)
	g.Expect(err).To(HaveOccurred())
	g.Expect(budget.Load().MaxClients).To(Equal(int64(300)))
}

// A burst of changes anywhere in the cluster makes one budget pass, not one per change.
func TestBudgetChangesCoalesce(t *testing.T) {
	g := NewWithT(t)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	h := loop.Coalescing{Delay: 50 * time.Millisecond, Req: budgetRequest}
	for range 100 {
		h.Update(context.Background(), event.UpdateEvent{}, q)
		h.Create(context.Background(), event.CreateEvent{}, q)
	}
	g.Expect(q.Len()).To(BeZero(), "nothing is queued before the delay")
	g.Eventually(q.Len).Should(Equal(1))
	g.Consistently(q.Len, 200*time.Millisecond).Should(Equal(1), "200 changes, one pass")
}
