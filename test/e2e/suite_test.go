// Package e2e runs Redline end to end on one machine with real parts: etcd, kube-apiserver and
// kube-controller-manager, a redis-server, the manager binary (controller and injection
// webhook) and three sidecar binaries configured from the Pods the webhook injected (see
// internal/testutil/stack). Token budgets run on a workload of their own whose sidecars proxy
// to a fake model API (budget_test.go). It is part of `make test`; `make e2e` runs it alone.
package e2e

import (
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// The workload every spec uses: one namespace, one Deployment of three replicas opted in to
// injection, the policies below selecting it.
const (
	namespace    = "e2e"
	replicas     = 3
	upstreamPort = 8080
)

var appLabels = map[string]string{"app": "shop"}

var (
	st       *stack.Stack
	upstream *stack.Upstream
	pods     []corev1.Pod
	sidecars []*stack.Sidecar
	proxies  []string // the sidecars' proxy URLs, in pod order
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Redline End-to-End Suite")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	// Redis's default user has a password, which only the manager holds: every sidecar gets in
	// as its namespace's own user (see tenants_test.go).
	st, err = stack.Start(ctx, stack.Options{Progress: GinkgoWriter, KeepDir: os.Getenv("REDLINE_E2E_KEEP") != "", RedisPassword: redisAdminPassword})
	// Cleanup first: Start stops what it started on failure, but a later failure needs this.
	if st != nil {
		DeferCleanup(func() {
			if CurrentSpecReport().Failed() || os.Getenv("REDLINE_E2E_KEEP") != "" {
				GinkgoWriter.Printf("stack logs are in %s (kept with REDLINE_E2E_KEEP=1)\n", st.Dir)
			}
			Expect(st.Stop()).To(Succeed())
		})
	}
	Expect(err).NotTo(HaveOccurred(), "starting the local stack")

	Expect(st.CreateNamespace(ctx, namespace)).To(Succeed())
	// The policies come first: a sidecar is ready only once its namespace has a compiled document.
	for _, p := range allPolicies() {
		Expect(st.ApplyPolicy(ctx, p)).To(Succeed())
	}
	for _, p := range allPolicies() {
		_, err := st.WaitProgrammed(ctx, namespace, p.Name, time.Minute)
		Expect(err).NotTo(HaveOccurred())
	}

	app := stack.App{Namespace: namespace, Name: "shop", Replicas: replicas, Labels: appLabels, UpstreamPort: upstreamPort}
	Expect(st.CreateDeployment(ctx, app)).To(Succeed())
	pods, err = st.WaitPods(ctx, app, time.Minute)
	Expect(err).NotTo(HaveOccurred())

	// The namespace's Redis user and Secret before its sidecars' first connection.
	waitIsolated(ctx, namespace)
	upstream, err = st.StartUpstream()
	Expect(err).NotTo(HaveOccurred())
	sidecars, err = st.RunSidecars(ctx, pods, upstream.Addr)
	Expect(err).NotTo(HaveOccurred())
	for _, sc := range sidecars {
		proxies = append(proxies, sc.ProxyURL)
	}
	buildKubectlRedline(ctx)
}, NodeTimeout(8*time.Minute))

// allPolicies are the suite's policies. Each matches its own path prefix, so the specs do not
// share counters; keys are fresh per spec for the same reason.
func allPolicies() []*v1alpha1.RateLimitPolicy {
	ps := []*v1alpha1.RateLimitPolicy{}
	for _, a := range algorithms {
		ps = append(ps, policy(exactName(a), exactPrefix(a), a, exactLimit, v1alpha1.FailureModeLocalFallback))
	}
	for _, m := range failureModes {
		ps = append(ps, policy(failName(m), failPrefix(m), v1alpha1.FixedWindow, failLimit, m))
	}
	return append(ps, policy(updateName, updatePrefix, v1alpha1.SlidingWindowLog, 100, v1alpha1.FailureModeOpen))
}
