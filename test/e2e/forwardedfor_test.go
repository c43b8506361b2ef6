package e2e

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

const (
	hopsNamespace = "e2e-hops"
	hopsLimit     = 20
	// The chain in front of the pods: a cloud load balancer, then ingress-nginx
	// (compute-full-forwarded-for), whose pod is the sidecar's peer. Each appends the address
	// it received the request from, so the client is the second entry from the right.
	hopsTrusted = 2
	lbAddr      = "10.0.0.5" // the load balancer, as ingress-nginx appends it
	clientA     = "203.0.113.10"
	clientB     = "203.0.113.20"
	clientC     = "203.0.113.30"
)

// chain is the X-Forwarded-For a request from client carries at the sidecar after the load
// balancer and ingress-nginx appended theirs, with what the client wrote itself (its own
// X-Forwarded-For, "" for none) on the left.
func chain(clientWrote, client string) string {
	if clientWrote == "" {
		return client + ", " + lbAddr
	}
	return clientWrote + ", " + client + ", " + lbAddr
}

// sendAs sends n requests from each client to one proxy, the clients interleaved (request i
// is client i%len(clients)'s), and returns the counts per client. xff makes client c's j-th
// X-Forwarded-For.
func sendAs(ctx SpecContext, proxy string, clients []string, n int, xff func(c, j int) string) []stack.Counts {
	// Send counts per target; one target per client, all the same proxy, so the per-target
	// counts are the per-client counts.
	targets := make([]string, len(clients))
	for i := range targets {
		targets[i] = proxy
	}
	t := stack.Send(ctx, targets, n*len(clients), 8, func(i int) stack.Request {
		return stack.Request{Path: fmt.Sprintf("/search/%d", i), Header: http.Header{"X-Forwarded-For": {xff(i%len(clients), i/len(clients))}}}
	})
	Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
	for i, c := range t.PerTarget {
		Expect(c.Sent).To(Equal(n), "client %s", clients[i])
	}
	return t.PerTarget
}

// Behind an ingress the sidecar's peer is the ingress pod for every client. A pod that says
// how many proxies stand in front of it (redline.dev/trusted-hops) keys ForwardedFor on the
// address those proxies wrote, the entry that many from the right of X-Forwarded-For, and
// never on what a client wrote to its left; a pod that does not keys every client on its
// peer, so all of them share one limit.
var _ = Describe("Client IP behind an ingress", func() {
	It("keys each client apart with the pod's trusted hops, ignores what a client writes, and shares the peer's limit without them", func(ctx SpecContext) {
		Expect(st.CreateNamespace(ctx, hopsNamespace)).To(Succeed())
		p := &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: hopsNamespace, Name: "search-per-client-ip"},
			Spec: v1alpha1.RateLimitPolicySpec{
				TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "search"}},
				FailureMode:    v1alpha1.FailureModeClosed,
				Rules: []v1alpha1.Rule{{
					Name:      "per-client-ip",
					Key:       []v1alpha1.KeyPart{{Attribute: v1alpha1.ForwardedFor}},
					Algorithm: v1alpha1.FixedWindow,
					// A long window: no window edge falls inside the spec.
					Limit: v1alpha1.Limit{Requests: hopsLimit, Window: metav1.Duration{Duration: 24 * time.Hour}},
					Mode:  v1alpha1.Enforce,
				}},
			},
		}
		Expect(st.ApplyPolicy(ctx, p)).To(Succeed())
		_, err := st.WaitProgrammed(ctx, hopsNamespace, p.Name, time.Minute)
		Expect(err).NotTo(HaveOccurred())
		waitIsolated(ctx, hopsNamespace)

		behind := stack.App{Namespace: hopsNamespace, Name: "search", Replicas: 1, UpstreamPort: upstreamPort,
			Labels:      map[string]string{"app": "search", "tier": "search"},
			Annotations: map[string]string{contract.AnnotationTrustedHops: fmt.Sprint(hopsTrusted)}}
		peer := stack.App{Namespace: hopsNamespace, Name: "search-peer", Replicas: 1, UpstreamPort: upstreamPort,
			Labels: map[string]string{"app": "search-peer", "tier": "search"}}
		run := func(app stack.App) (*stack.Sidecar, *corev1.Container) {
			GinkgoHelper()
			Expect(st.CreateDeployment(ctx, app)).To(Succeed())
			ps, err := st.WaitPods(ctx, app, time.Minute)
			Expect(err).NotTo(HaveOccurred())
			sc, err := st.RunSidecar(ctx, &ps[0], upstream.Addr)
			Expect(err).NotTo(HaveOccurred())
			return sc, &sc.Container
		}

		By("the annotation reaches the injected sidecar's flags")
		behindSC, behindCtr := run(behind)
		Expect(behindCtr.Args).To(ContainElement(fmt.Sprintf("--%s=%d", contract.FlagTrustedHops, hopsTrusted)))
		Expect(behindSC.Args).To(ContainElement(fmt.Sprintf("--%s=%d", contract.FlagTrustedHops, hopsTrusted)), "the process runs with the pod's flag")
		peerSC, peerCtr := run(peer)
		Expect(peerCtr.Args).NotTo(ContainElement(HavePrefix("--"+contract.FlagTrustedHops)), "without the annotation (and a manager default of 0) nothing is passed")

		By("two clients, A writing a new left-most entry into every request, B none: each gets exactly its own limit")
		before := upstream.Hits()
		got := sendAs(ctx, behindSC.ProxyURL, []string{clientA, clientB}, 3*hopsLimit, func(c, j int) string {
			if c == 0 {
				return chain(fmt.Sprintf("198.51.100.%d", j), clientA)
			}
			return chain("", clientB)
		})
		GinkgoWriter.Printf("trusted-hops=%d: client A (spoofing the left-most entry) sent %d, admitted %d, refused %d; client B sent %d, admitted %d, refused %d\n",
			hopsTrusted, got[0].Sent, got[0].Admitted, got[0].Limited, got[1].Sent, got[1].Admitted, got[1].Limited)
		for i, who := range []string{"A", "B"} {
			Expect(got[i].Admitted).To(Equal(hopsLimit), "client %s", who)
			Expect(got[i].Limited).To(Equal(2*hopsLimit), "client %s", who)
		}
		Expect(upstream.Hits() - before).To(BeEquivalentTo(2 * hopsLimit))

		By("client C writing A's exhausted address on the left is counted as C, not as A")
		got = sendAs(ctx, behindSC.ProxyURL, []string{clientC}, 2*hopsLimit, func(int, int) string { return chain(clientA, clientC) })
		GinkgoWriter.Printf("trusted-hops=%d: client C (writing A's address on the left) sent %d, admitted %d, refused %d\n",
			hopsTrusted, got[0].Sent, got[0].Admitted, got[0].Limited)
		Expect(got[0].Admitted).To(Equal(hopsLimit))
		Expect(got[0].Limited).To(Equal(hopsLimit))

		By("the same traffic to the pod without trusted hops: every client is the peer, one limit for all")
		got = sendAs(ctx, peerSC.ProxyURL, []string{clientA, clientB}, 3*hopsLimit, func(c, j int) string {
			if c == 0 {
				return chain(fmt.Sprintf("198.51.100.%d", j), clientA)
			}
			return chain("", clientB)
		})
		GinkgoWriter.Printf("trusted-hops=0: client A sent %d, admitted %d; client B sent %d, admitted %d; together %d\n",
			got[0].Sent, got[0].Admitted, got[1].Sent, got[1].Admitted, got[0].Admitted+got[1].Admitted)
		Expect(got[0].Admitted+got[1].Admitted).To(Equal(hopsLimit), "A and B share the peer's limit")
		Expect(got[0].Limited + got[1].Limited).To(Equal(5 * hopsLimit))
	})
})
