package cluster

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestRollingUpdateLosesNoRequest rolls the sample workload (a new pod template: new pods with
// new sidecars, the old ones terminated) while two clients keep sending requests through the
// Service's ClusterIP on kept-alive connections: not one request fails. The stand-in starts no
// pod and routes no Service, so only here do a terminating sidecar, kube-proxy's endpoint
// updates and the kubelet's termination order meet.
func TestRollingUpdateLosesNoRequest(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := suite.client
	ns := "rollout"
	deploySample(t, g, ctx, ns)
	before := awaitReadyPods(g, ctx, ns, 3)
	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &svc)).To(Succeed())
	// GET / is outside the policy (POST /api): every request should reach the application.
	url := fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, before)

	ld := startLoad(ctx, url, 2)

	t0 := time.Now()
	var dep appsv1.Deployment
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
	patch := client.MergeFrom(dep.DeepCopy())
	if dep.Spec.Template.Annotations == nil {
		dep.Spec.Template.Annotations = map[string]string{}
	}
	dep.Spec.Template.Annotations["redline.dev/test-rollout"] = t0.UTC().Format(time.RFC3339Nano)
	g.Expect(c.Patch(ctx, &dep, patch)).To(Succeed())
	after := awaitReadyPods(g, ctx, ns, 3)
	rolled := time.Since(t0)
	// The last old pods' termination (their application's drain) goes on after the Deployment
	// counts the new ones available: keep sending until they are gone.
	g.Eventually(func(g Gomega) {
		for _, p := range before {
			var cur corev1.Pod
			err := c.Get(ctx, client.ObjectKeyFromObject(&p), &cur)
			g.Expect(err).To(HaveOccurred(), "old pod %s still exists", p.Name)
		}
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	time.Sleep(2 * time.Second)
	ok, failed := ld.stop()
	for _, p := range after {
		for _, o := range before {
			g.Expect(p.Name).NotTo(Equal(o.Name), "every pod should be new")
		}
	}
	logf("rolling update of 3 pods: %s to available, %d requests answered 200, %d failed %v", rolled.Round(100*time.Millisecond), ok, len(failed), first(failed, 5))
	g.Expect(ok).To(BeNumerically(">", 0))
	g.Expect(failed).To(BeEmpty(), "requests failed at the client during the rolling update")
}

func get(ctx context.Context, hc *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// load is clients sending GET (outside the policy) through a Service on kept-alive connections,
// each request's answer counted, until stop.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	ok     int
	failed []string
}

// startLoad starts clients sending GET url one after another, 10 ms apart.
func startLoad(ctx context.Context, url string, clients int) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel}
	for range clients {
		l.wg.Go(func() {
			hc := &http.Client{Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				code, err := get(ctx, hc, url)
				if ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				switch {
				case err != nil:
					l.failed = append(l.failed, err.Error())
				case code != http.StatusOK:
					l.failed = append(l.failed, fmt.Sprintf("status %d", code))
				default:
					l.ok++
				}
				l.mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	return l
}

// stop ends the clients and returns the requests answered 200 and why the others failed.
func (l *load) stop() (int, []string) {
	l.cancel()
	l.wg.Wait()
	return l.ok, l.failed
}
