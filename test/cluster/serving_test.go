package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
)

// awaitServedByAll sends GET / (outside the sample policy, so nothing is counted) through the
// Service at ip until every one of pods has answered: only then has kube-proxy every endpoint,
// and a count or a load that starts sooner would meet a Service without them (connection
// refused) or miss the newest pods.
func awaitServedByAll(g *WithT, ctx context.Context, ip string, pods []corev1.Pod) {
	want := map[string]bool{}
	for _, p := range pods {
		want[p.Name] = true
	}
	seen := map[string]bool{}
	// A new connection a request: kube-proxy picks an endpoint per connection.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://%s:80/", ip)
	g.Eventually(func(g Gomega) {
		for range 4 * len(pods) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			g.Expect(err).NotTo(HaveOccurred())
			resp, err := hc.Do(req)
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && want[strings.TrimSpace(string(b))] {
				seen[strings.TrimSpace(string(b))] = true
			}
		}
		g.Expect(seen).To(HaveLen(len(want)), "pods that answered through %s", ip)
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// sidecarCounter sums a counter of the sidecars' metrics (their admin port, 9091, on the pod
// network) over pods: the decisions a failure mode made (degraded) tell a count that is exact
// by the shared counter from one that fell back to local limits.
func sidecarCounter(g *WithT, ctx context.Context, pods []corev1.Pod, name string) float64 {
	var sum float64
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, p := range pods {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Status.PodIP+":9091/metrics", nil)
		g.Expect(err).NotTo(HaveOccurred())
		resp, err := hc.Do(req)
		g.Expect(err).NotTo(HaveOccurred(), "the metrics of pod %s's sidecar", p.Name)
		sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			g.Expect(err).NotTo(HaveOccurred(), "parsing %q", line)
			sum += v
		}
		_ = resp.Body.Close()
	}
	return sum
}
