package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestHPAScaleOutKeepsLimitExact has a HorizontalPodAutoscaler, fed by metrics-server, scale the
// sample workload out under load (3 to 5 replicas on the pods' CPU), and checks the policy's
// one limit over every replica, old and new, two ways: the statuses the client got, and what
// the application behind the sidecars counted it served (./echo, independent of Redline).
//
// The policy is the sample's with a window of 20 to 24 hours, the one whose end is furthest on
// Redis's clock (the scale-out takes minutes on a busy machine; no test waits for a window).
// Key A: 50 requests before the load (all admitted), 250 once the workload runs 5 replicas:
// exactly 50 more, some by the new pods. Key B: 150 requests sent as soon as
// the HPA asked for more pods, while they start: exactly 100.
func TestHPAScaleOutKeepsLimitExact(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c := suite.client
	ns := "autoscale"
	window := roomiestWindow(g, ctx)
	deploySample(t, g, ctx, ns, func(p *unstructured.Unstructured) {
		rules, _, _ := unstructured.NestedSlice(p.Object, "spec", "rules")
		g.Expect(unstructured.SetNestedField(rules[0].(map[string]any), window.String(), "limit", "window")).To(Succeed())
		g.Expect(unstructured.SetNestedSlice(p.Object, rules, "spec", "rules")).To(Succeed())
	})
	old := awaitReadyPods(g, ctx, ns, 3)
	createHPA(g, ctx, ns, 3, 5, "20m")
	idle := awaitHPAMetric(g, ctx, ns)
	logf("the HPA reads the pods' CPU through metrics-server: %s a pod before the load", idle)

	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &svc)).To(Succeed())
	url := fmt.Sprintf("http://%s:80/api/orders", svc.Spec.ClusterIP)
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, old)

	w := awaitWindowRoom(g, ctx, window, 15*time.Minute)
	keyA, keyB := newAPIKey(g), newAPIKey(g)
	before, byBefore, errs := sendCounting(ctx, url, keyA, 50, 5)
	g.Expect(errs).To(BeEmpty())
	g.Expect(before).To(Equal(map[int]int{http.StatusOK: 50}))

	t0 := time.Now()
	seen := watchReplicas(ctx, ns)
	ld := startCPULoad(ctx, fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP), 8)
	defer ld.stop()
	g.Eventually(func(g Gomega) {
		var dep appsv1.Deployment
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
		g.Expect(*dep.Spec.Replicas).To(BeNumerically(">", 3), "the HPA should ask for more replicas under load")
	}).WithContext(ctx).WithTimeout(10 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	logf("the HPA asked for more replicas %s after the load started", since(t0))
	mid, byMid, errs := sendCounting(ctx, url, keyB, 150, 10)
	logf("150 requests of key B while the new pods start: %v, admitted by %v", mid, byMid)
	g.Expect(errs).To(BeEmpty())
	g.Expect(mid).To(Equal(map[int]int{http.StatusOK: 100, http.StatusTooManyRequests: 50}))

	all := awaitReadyPods(g, ctx, ns, 5)
	served := ld.stop()
	logf("scaled out 3 -> 5 Ready replicas %s after the load started (%d requests of load); replicas seen: %s",
		since(t0), served, seen())
	for _, p := range all {
		g.Expect(hasSidecar(p)).To(BeTrue(), "pod %s should carry the injected sidecar", p.Name)
	}
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, all)

	after, byAfter, errs := sendCounting(ctx, url, keyA, 250, 10)
	g.Expect(windowIndex(g, ctx, window)).To(Equal(w),
		"the requests crossed the window's boundary on Redis's clock: the run cannot be judged, run it again")
	degraded := sidecarCounter(g, ctx, all, "redline_sidecar_degraded_decisions_total")
	logf("key A after the scale-out, 250 requests: %v, admitted by %v; decisions of the failure mode %v", after, byAfter, degraded)
	g.Expect(errs).To(BeEmpty())
	g.Expect(degraded).To(BeZero(), "every decision should come from the shared counter in Redis")
	g.Expect(after).To(Equal(map[int]int{http.StatusOK: 50, http.StatusTooManyRequests: 200}),
		"one limit of 100 over 3 old and 2 new replicas")
	oldNames := map[string]bool{}
	for _, p := range old {
		oldNames[p.Name] = true
	}
	var byNew int
	for name, n := range byAfter {
		if !oldNames[name] {
			byNew += n
		}
	}
	g.Expect(byNew).To(BeNumerically(">", 0), "kube-proxy should have sent some admitted requests to the new pods")

	// What the application counted it served, pod by pod, is what the client saw admitted.
	for key, admitted := range map[string]map[string]int{keyA: sum(byBefore, byAfter), keyB: byMid} {
		upstream := servedByKey(g, ctx, all, key)
		logf("the application counted for key %s: %v", key, upstream)
		g.Expect(upstream).To(Equal(admitted), "what each pod's application served of key %s", key)
		g.Expect(total(upstream)).To(Equal(100))
	}
}

// roomiestWindow is the window of 20 to 24 whole hours with the most of it left on Redis's
// clock: windows are aligned to multiples of their length, so their ends differ, and one of
// them is hours away.
func roomiestWindow(g *WithT, ctx context.Context) time.Duration {
	now, err := suite.redis.client.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	var best, room time.Duration
	for h := 20; h <= 24; h++ {
		w := time.Duration(h) * time.Hour
		if left := w - time.Duration(now.UnixMilli()%w.Milliseconds())*time.Millisecond; left > room {
			best, room = w, left
		}
	}
	return best
}

// createHPA creates an autoscaling/v2 HPA of the sample Deployment on the pods' average CPU
// (an absolute value: the injected sidecar sets no CPU request) that never scales in: the
// tests count over the pods it started.
func createHPA(g *WithT, ctx context.Context, ns string, minReplicas, maxReplicas int32, cpu string) {
	disabled := autoscalingv2.DisabledPolicySelect
	avg := resource.MustParse(cpu)
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "checkout", Namespace: ns},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout"},
			MinReplicas:    &minReplicas,
			MaxReplicas:    maxReplicas,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ResourceMetricSourceType,
				Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: &avg}},
			}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleDown: &autoscalingv2.HPAScalingRules{SelectPolicy: &disabled},
			},
		},
	}
	g.Expect(suite.client.Create(ctx, hpa)).To(Succeed())
}

// awaitHPAMetric waits until the HPA of ns reads the pods' CPU (metrics-server serves it) and
// returns the average it read.
func awaitHPAMetric(g *WithT, ctx context.Context, ns string) string {
	var avg string
	g.Eventually(func(g Gomega) {
		var hpa autoscalingv2.HorizontalPodAutoscaler
		g.Expect(suite.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &hpa)).To(Succeed())
		var active string
		for _, c := range hpa.Status.Conditions {
			if c.Type == autoscalingv2.ScalingActive {
				active = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
		g.Expect(active).To(HavePrefix("True"), "the HPA's ScalingActive")
		g.Expect(hpa.Status.CurrentMetrics).NotTo(BeEmpty())
		cur := hpa.Status.CurrentMetrics[0].Resource
		g.Expect(cur).NotTo(BeNil())
		g.Expect(cur.Current.AverageValue).NotTo(BeNil())
		avg = cur.Current.AverageValue.String()
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return avg
}

// watchReplicas records the sample Deployment's asked and Ready replica counts as they change,
// until ctx ends; the function returned tells the counts seen so far.
func watchReplicas(ctx context.Context, ns string) func() string {
	var (
		mu           sync.Mutex
		asked, ready []string
	)
	note := func(s *[]string, n int32) {
		v := strconv.Itoa(int(n))
		if len(*s) == 0 || (*s)[len(*s)-1] != v {
			*s = append(*s, v)
		}
	}
	go func() {
		for ctx.Err() == nil {
			var dep appsv1.Deployment
			if err := suite.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep); err == nil {
				mu.Lock()
				note(&asked, *dep.Spec.Replicas)
				note(&ready, dep.Status.ReadyReplicas)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return "asked " + strings.Join(asked, " -> ") + ", Ready " + strings.Join(ready, " -> ")
	}
}

// cpuLoad is clients sending GET (outside the policy) through a Service as fast as answered, on
// connections renewed every 100 requests so that kube-proxy spreads them over new pods too.
type cpuLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	ok     int
	once   sync.Once
}

func startCPULoad(ctx context.Context, url string, clients int) *cpuLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &cpuLoad{cancel: cancel}
	for range clients {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				tr := &http.Transport{}
				hc := &http.Client{Timeout: 10 * time.Second, Transport: tr}
				for range 100 {
					if code, err := get(ctx, hc, url); err == nil && code == http.StatusOK {
						l.mu.Lock()
						l.ok++
						l.mu.Unlock()
					}
					if ctx.Err() != nil {
						break
					}
				}
				tr.CloseIdleConnections()
			}
		})
	}
	return l
}

// stop ends the clients (once) and returns the requests answered 200.
func (l *cpuLoad) stop() int {
	l.once.Do(func() {
		l.cancel()
		l.wg.Wait()
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok
}

// servedByKey is what each pod's application counted it served of key (GET /served?key= on
// the application's own port, around the sidecar), pods that served none left out.
func servedByKey(g *WithT, ctx context.Context, pods []corev1.Pod, key string) map[string]int {
	out := map[string]int{}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, p := range pods {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Status.PodIP+":8080/served?key="+key, nil)
		g.Expect(err).NotTo(HaveOccurred())
		resp, err := hc.Do(req)
		g.Expect(err).NotTo(HaveOccurred(), "what pod %s's application served", p.Name)
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
		_ = resp.Body.Close()
		g.Expect(err).NotTo(HaveOccurred())
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		g.Expect(err).NotTo(HaveOccurred(), "pod %s's /served: %q", p.Name, b)
		if n > 0 {
			out[p.Name] = n
		}
	}
	return out
}

func sum(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for _, m := range []map[string]int{a, b} {
		for k, v := range m {
			out[k] += v
		}
	}
	return out
}

func total(m map[string]int) int {
	var n int
	for _, v := range m {
		n += v
	}
	return n
}
