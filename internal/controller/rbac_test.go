package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// The manager runs with the ClusterRole that `make manifests` generates from the RBAC markers,
// and with nothing more: its caches sync under it, and it may read, never write, the workloads
// and HorizontalPodAutoscalers the connection budget adds up.
var _ = Describe("The generated ClusterRole", Ordered, func() {
	ctx := context.Background()
	const user = "redline-least-privilege"

	It("is enough for the manager, and read-only for workloads and HPAs", func() {
		raw, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(raw, role)).To(Succeed())
		Expect(role.Rules).NotTo(BeEmpty())
		role.ObjectMeta = metav1.ObjectMeta{GenerateName: "redline-manager-under-test-"}
		Expect(k8s.Create(ctx, role)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, role) })
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "redline-manager-under-test-"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, binding) })

		allowed := func(verb, group, resource string) bool {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               user,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: "default"},
			}}
			Expect(k8s.Create(ctx, sar)).To(Succeed())
			return sar.Status.Allowed
		}
		Eventually(func() bool { return allowed("list", "autoscaling", "horizontalpodautoscalers") }, timeout, interval).
			Should(BeTrue(), "the binding takes effect")
		for _, r := range []struct{ group, resource string }{
			{"autoscaling", "horizontalpodautoscalers"}, {"apps", "deployments"}, {"apps", "statefulsets"}, {"apps", "replicasets"},
		} {
			for _, verb := range []string{"get", "list", "watch"} {
				Expect(allowed(verb, r.group, r.resource)).To(BeTrue(), "%s %s/%s", verb, r.group, r.resource)
			}
			for _, verb := range []string{"create", "update", "patch", "delete", "deletecollection"} {
				Expect(allowed(verb, r.group, r.resource)).To(BeFalse(), "%s %s/%s must be refused", verb, r.group, r.resource)
			}
		}
		for _, verb := range []string{"get", "list"} {
			Expect(allowed(verb, "", "secrets")).To(BeFalse(), "%s secrets must be refused", verb)
		}
		for _, verb := range []string{"update", "delete"} {
			Expect(allowed(verb, "redline.dev", "ratelimitpolicies")).To(BeFalse(), "%s policies must be refused: the manager writes status only", verb)
		}

		// The manager's controllers under that user alone: /readyz needs every cache synced,
		// so any list or watch the role lacks keeps it unready.
		readyz := startManagerAs(ctx, user)
		Eventually(readyz, timeout, interval).Should(Equal(http.StatusOK), "every cache syncs under the generated role")
	})
})

// startManagerAs runs the manager's controllers in this process as user, with nothing granted
// here, until the spec ends, and returns a probe of its /readyz status (0 while unreachable).
func startManagerAs(ctx context.Context, user string) func() int {
	u, err := testEnv.AddUser(envtest.User{Name: user}, nil)
	Expect(err).NotTo(HaveOccurred())
	port, err := redistest.FreePort()
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	mgr, err := ctrl.NewManager(u.Config(), ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: fmt.Sprintf("127.0.0.1:%d", port),
		Cache:                  controller.CacheOptions(cache.Options{}),
		// The suite's manager runs the same controllers in this process.
		Controller: config.Controller{SkipNameValidation: new(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	// As cmd/manager wires them: the manager's Redis is the default backend, RedisBackends are
	// read through the cache. Without Dial: this manager, the leader of its own, would write
	// the suite's RedisBackends' status from Secrets the ClusterRole does not let it read.
	def := backend.New("", "", redis.NewClient(&redis.Options{Addr: redisSrv.Addr()}), nil, nil, 0, time.Minute, nil)
	err = controller.Setup(mgr, controller.Config{Backends: backend.NewRegistry(def, mgr.GetCache())})
	Expect(err).NotTo(HaveOccurred())
	mctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	go func() { _ = mgr.Start(mctx) }()
	return func() int {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
}
