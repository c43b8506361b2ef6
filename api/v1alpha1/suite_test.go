package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// The API suite holds the CRDs' schema to what a user is told: the API server alone, given
// config/crd/bases, refuses what the markers and CEL rules refuse, with their messages. What
// the controllers make of what it accepts is internal/controller's suite.
var (
	k8s     client.Client
	testEnv *envtest.Environment
)

func TestAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "API Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which installs etcd and kube-apiserver (hack/setup-envtest.sh)")
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rlp-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// policy is a valid one-rule policy, for a spec to break one field of.
func policy(ns, name string, requests int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "checkout"}},
			Rules: []v1alpha1.Rule{{
				Name:      "per-api-key",
				Match:     &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Value: "/api/"}, Methods: []v1alpha1.HTTPMethod{"POST"}},
				Key:       []v1alpha1.KeyPart{{Header: "X-API-Key"}},
				Algorithm: v1alpha1.SlidingWindowCounter,
				Limit:     v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
}

// rawPolicy is a policy as a user writes it, any field of any JSON type.
func rawPolicy(ns, name string, rule map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "RateLimitPolicy",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"targetSelector": map[string]any{"matchLabels": map[string]any{"app": "checkout"}},
			"rules":          []any{rule},
		},
	}}
}

func rawRule(window any) map[string]any {
	return map[string]any{
		"name":  "r",
		"key":   []any{map[string]any{"header": "X-API-Key"}},
		"limit": map[string]any{"requests": int64(100), "window": window},
	}
}

// pathPolicy is a one-rule policy (rule "r") with this match, as a user writes it.
func pathPolicy(ns, name string, match map[string]any) client.Object {
	rule := rawRule("1m")
	rule["match"] = match
	return rawPolicy(ns, name, rule)
}

func pathValue(typ, value string) map[string]any {
	p := map[string]any{"value": value}
	if typ != "" {
		p["type"] = typ
	}
	return map[string]any{"path": p}
}
