package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestScaleOutKeepsLimitExact scales the sample workload from 3 to 6 replicas in the middle of
// one minute of one API key: 50 requests before (all admitted), then 250 spread by kube-proxy
// over old and new pods: exactly 50 more are admitted, some by the new pods, whose sidecars
// start with the shared count, not a fresh allowance of their own.
func TestScaleOutKeepsLimitExact(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := suite.client
	ns := "scale"
	deploySample(t, g, ctx, ns)
	old := awaitReadyPods(g, ctx, ns, 3)
	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &svc)).To(Succeed())
	url := fmt.Sprintf("http://%s:80/api/orders", svc.Spec.ClusterIP)
	key := newAPIKey(g)
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, old)

	w := awaitWindowRoom(g, ctx, time.Minute, 50*time.Second)
	before, _, errs := sendCounting(ctx, url, key, 50, 5)
	g.Expect(errs).To(BeEmpty())
	g.Expect(before).To(Equal(map[int]int{http.StatusOK: 50}))

	t0 := time.Now()
	var dep appsv1.Deployment
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
	patch := client.MergeFrom(dep.DeepCopy())
	six := int32(6)
	dep.Spec.Replicas = &six
	g.Expect(c.Patch(ctx, &dep, patch)).To(Succeed())
	all := awaitReadyPods(g, ctx, ns, 6)
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, all)
	logf("scaled 3 -> 6 pods, each answering through the Service, in %s", since(t0))

	after, servedBy, errs := sendCounting(ctx, url, key, 250, 10)
	g.Expect(windowIndex(g, ctx, time.Minute)).To(Equal(w),
		"the requests crossed a window boundary on Redis's clock: the run cannot be judged, run it again")
	degraded := sidecarCounter(g, ctx, all, "redline_sidecar_degraded_decisions_total")
	logf("after the scale-out, 250 requests: %v, admitted by %v, decisions of the failure mode %v", after, servedBy, degraded)
	g.Expect(errs).To(BeEmpty())
	g.Expect(degraded).To(BeZero(), "every decision should come from the shared counter in Redis")
	g.Expect(after).To(Equal(map[int]int{http.StatusOK: 50, http.StatusTooManyRequests: 200}),
		"one limit of 100 over 3 old and 3 new replicas")
	oldNames := map[string]bool{}
	for _, p := range old {
		oldNames[p.Name] = true
	}
	var byNew int
	for _, p := range all {
		if !oldNames[p.Name] {
			byNew += servedBy[p.Name]
		}
	}
	g.Expect(byNew).To(BeNumerically(">", 0), "kube-proxy should have sent some admitted requests to the new pods")
}

// sendCounting POSTs n requests with the API key from workers clients and counts the statuses
// and, by pod name (./echo's answer), who served each 200.
func sendCounting(ctx context.Context, url, key string, n, workers int) (map[int]int, map[string]int, []error) {
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		servedBy = map[string]int{}
		errs     []error
		wg       sync.WaitGroup
		jobs     = make(chan struct{}, n)
	)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	// A new connection a request, so that kube-proxy spreads the requests over every pod (it
	// picks an endpoint per connection), the newest ones too.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range workers {
		wg.Go(func() {
			for range jobs {
				code, body, err := postBody(ctx, hc, url, key)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					statuses[code]++
					if code == http.StatusOK {
						servedBy[strings.TrimSpace(body)]++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return statuses, servedBy, errs
}

func postBody(ctx context.Context, hc *http.Client, url, key string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-API-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), err
}
