package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// keyHeader is the header every rule of the suite keys on.
const keyHeader = "X-Client"

// Exact admission: a long window, so no window edge or refill falls inside a spec.
const exactLimit = 100

var algorithms = []v1alpha1.Algorithm{
	v1alpha1.FixedWindow, v1alpha1.SlidingWindowLog, v1alpha1.SlidingWindowCounter, v1alpha1.TokenBucket,
}

func exactName(a v1alpha1.Algorithm) string   { return "exact-" + strings.ToLower(string(a)) }
func exactPrefix(a v1alpha1.Algorithm) string { return "/exact/" + strings.ToLower(string(a)) + "/" }

// Failure modes: while Redis is down, LocalFallback admits failLimit/replicas per replica.
const failLimit = 30

var failureModes = []v1alpha1.FailureMode{v1alpha1.FailureModeOpen, v1alpha1.FailureModeClosed, v1alpha1.FailureModeLocalFallback}

func failName(m v1alpha1.FailureMode) string   { return "fail-" + strings.ToLower(string(m)) }
func failPrefix(m v1alpha1.FailureMode) string { return "/fail/" + strings.ToLower(string(m)) + "/" }

// The policy the update and delete specs change.
const (
	updateName   = "update"
	updatePrefix = "/update/"
)

// policy is a one-rule policy selecting the suite's app: requests per day under pathPrefix,
// one counter per value of keyHeader.
func policy(name, pathPrefix string, alg v1alpha1.Algorithm, requests int64, mode v1alpha1.FailureMode) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: appLabels},
			FailureMode:    mode,
			Rules: []v1alpha1.Rule{{
				Name:      "per-client",
				Match:     &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchPathPrefix, Value: pathPrefix}},
				Key:       []v1alpha1.KeyPart{{Header: keyHeader}},
				Algorithm: alg,
				Limit:     v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: 24 * time.Hour}},
				Mode:      v1alpha1.Enforce,
			}},
		},
	}
}

var keySeq atomic.Int64

// freshKey returns a client key no earlier request used, so each run starts from an empty
// counter whatever ran before.
func freshKey(what string) string {
	return fmt.Sprintf("%s-%d-%d", what, time.Now().UnixNano(), keySeq.Add(1))
}

// send sends n GET requests under prefix with one client key, round-robin over the three
// sidecars' proxies.
func send(ctx context.Context, prefix, key string, n, concurrency int) stack.Tally {
	return stack.Send(ctx, proxies, n, concurrency, func(i int) stack.Request {
		return stack.Request{Path: fmt.Sprintf("%sitem/%d", prefix, i), Header: http.Header{keyHeader: {key}}}
	})
}

// expectAllProgrammed asserts that every policy of the suite that still exists is Programmed
// for its current generation.
func expectAllProgrammed(g Gomega, ctx context.Context) {
	var list v1alpha1.RateLimitPolicyList
	g.Expect(st.Client.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
	g.Expect(list.Items).NotTo(BeEmpty())
	for _, p := range list.Items {
		c := meta.FindStatusCondition(p.Status.Conditions, "Programmed")
		g.Expect(c).NotTo(BeNil(), "policy %s has no Programmed condition", p.Name)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "policy %s: Programmed %s %s: %s", p.Name, c.Status, c.Reason, c.Message)
		g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation), "policy %s", p.Name)
	}
}

// expectScriptsLoaded asserts that every script the namespace's document names is in Redis.
func expectScriptsLoaded(g Gomega, ctx context.Context) {
	doc, _, err := st.PoliciesDocument(ctx, namespace)
	g.Expect(err).NotTo(HaveOccurred())
	rdb := redisClient()
	defer func() { _ = rdb.Close() }()
	var shas []string
	for _, sha := range doc.Scripts {
		shas = append(shas, sha)
	}
	exists, err := rdb.ScriptExists(ctx, shas...).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists).To(HaveEach(BeTrue()), "scripts %v", shas)
}

// redisAdminPassword is the password of the stack's Redis default user: the admin's.
const redisAdminPassword = "e2e-admin-password"

// redisClient returns an admin client of the stack's Redis for fault injection.
func redisClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: st.Redis.Addr(), Password: redisAdminPassword, MaxRetries: -1})
}

// sumMetric adds a sidecar metric over the three sidecars.
func sumMetric(g Gomega, ctx context.Context, name string, labels map[string]string) float64 {
	total := 0.0
	for _, sc := range sidecars {
		v, err := sc.Metric(ctx, name, labels)
		g.Expect(err).NotTo(HaveOccurred())
		total += v
	}
	return total
}

// waitIsolated waits until every policy of ns says TenantIsolation=True: its Redis user is set
// and its Secret written, so that sidecars started now log in at their first connection (one
// started before fails its first calls and opens its breaker).
func waitIsolated(ctx context.Context, ns string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var list v1alpha1.RateLimitPolicyList
		g.Expect(st.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).NotTo(BeEmpty())
		for _, p := range list.Items {
			c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionTenantIsolation)
			g.Expect(c).NotTo(BeNil(), "%s/%s has no TenantIsolation yet", ns, p.Name)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s/%s: %s %s", ns, p.Name, c.Reason, c.Message)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonTenantIsolated))
		}
	}).WithTimeout(time.Minute).Should(Succeed())
}
