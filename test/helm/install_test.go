package helm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// monitoringPackage holds the Prometheus Operator's API types; controller-gen turns them
// into the ServiceMonitor, PodMonitor and PrometheusRule CRDs the API server learns.
const monitoringPackage = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

// controllerGen is the controller-gen binary (the Makefile passes CONTROLLER_GEN; bin/ of the
// repository otherwise).
func controllerGen(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CONTROLLER_GEN")
	if bin == "" {
		bin = filepath.Join(RepoRoot(), "bin", "controller-gen")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("controller-gen not found at %s (run `make controller-gen`, or set CONTROLLER_GEN): %v", bin, err)
	}
	return bin
}

// monitoringCRDs generates the Prometheus Operator's CRDs from its Go types into a directory.
func monitoringCRDs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(controllerGen(t), "crd:crdVersions=v1,maxDescLen=0", "paths="+monitoringPackage, "output:crd:dir="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("generating the monitoring CRDs with controller-gen: %v\n%s", err, out.String())
	}
	return dir
}

// startAPIServer starts etcd and kube-apiserver (KUBEBUILDER_ASSETS) knowing the Prometheus
// Operator's CRDs; the chart brings Redline's own.
func startAPIServer(t *testing.T) *envtest.Environment {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run through `make test-helm`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	env := &envtest.Environment{
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: []string{monitoringCRDs(t)}},
		ErrorIfCRDPathMissing: true,
	}
	if _, err := env.Start(); err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

// helmConfig is Helm's action configuration for the API server, as an administrator.
func helmConfig(t *testing.T, env *envtest.Environment) *action.Configuration {
	t.Helper()
	user, err := env.AddUser(envtest.User{Name: "helm-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	ns := Namespace
	flags.KubeConfig, flags.Namespace = &path, &ns
	cfg := &action.Configuration{}
	if err := cfg.Init(flags, Namespace, "secret", t.Logf); err != nil {
		t.Fatalf("initialising helm: %v", err)
	}
	return cfg
}

// installValues turn every optional object on, so that the API server sees each of them, and
// set the sidecar's cluster-wide defaults, so that the manager run from the chart is seen to
// accept and inject them.
func installValues(redisURL string) map[string]any {
	return map[string]any{
		"redis":   map[string]any{"url": redisURL},
		"webhook": map[string]any{"certificates": "selfSigned"},
		"sidecar": installSidecarDefaults,
		"monitoring": map[string]any{
			"serviceMonitor": map[string]any{"enabled": true},
			"podMonitor":     map[string]any{"enabled": true},
			"prometheusRule": map[string]any{"enabled": true},
			"dashboards":     map[string]any{"enabled": true},
		},
	}
}

var policyGVK = schema.GroupVersionKind{Group: "redline.dev", Version: "v1alpha1", Kind: "RateLimitPolicy"}

// TestInstallUpgradeUninstall installs the chart into a real kube-apiserver with every
// optional object on (each one accepted), runs the manager from the rendered Deployment with
// the chart's RBAC, upgrades to a new chart version and uninstalls; policies and the CRD
// survive both.
func TestInstallUpgradeUninstall(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	redis, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "starting redis-server")
	t.Cleanup(func() { _ = redis.Close() })

	env := startAPIServer(t)
	admin, err := client.New(env.Config, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	cfg := helmConfig(t, env)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	vals := installValues(redis.URL())

	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = ReleaseName, Namespace, true
	install.Timeout = time.Minute
	rel, err := install.RunWithContext(ctx, ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	objs, err := Objects(rel.Manifest)
	g.Expect(err).NotTo(HaveOccurred())
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(o), got)).To(Succeed(), "%s %s after helm install", o.GetKind(), o.GetName())
	}
	for _, k := range []string{"CustomResourceDefinition", "Deployment", "MutatingWebhookConfiguration", "ClusterRole", "Role",
		"PodDisruptionBudget", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "Service"} {
		g.Expect(kinds).To(HaveKey(k), "the install should create a %s", k)
	}

	// A tenant's policy, to survive the upgrade and the uninstall.
	g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})).To(Succeed())
	policy := samplePolicy(t)
	policy.SetNamespace("shop")
	g.Expect(admin.Create(ctx, policy)).To(Succeed())

	t.Run("manager from the chart's pod spec reaches ready", func(t *testing.T) {
		runManagerFromChart(t, ctx, env, admin)
	})

	t.Run("upgrade keeps policies", func(t *testing.T) {
		g := NewWithT(t)
		var crdBefore unstructured.Unstructured
		crdBefore.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: "ratelimitpolicies.redline.dev"}, &crdBefore)).To(Succeed())
		next, err := LoadChart()
		g.Expect(err).NotTo(HaveOccurred())
		next.Metadata.Version, next.Metadata.AppVersion = "0.2.0", "0.2.0"
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Timeout = Namespace, time.Minute
		rel, err := up.RunWithContext(ctx, ReleaseName, next, vals)
		g.Expect(err).NotTo(HaveOccurred(), "helm upgrade")
		g.Expect(rel.Version).To(Equal(2))
		var dep appsv1.Deployment
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "redline-manager"}, &dep)).To(Succeed())
		g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(HaveSuffix(":0.2.0"), "the upgrade rolls the manager to the new appVersion")
		var crdAfter unstructured.Unstructured
		crdAfter.SetGroupVersionKind(crdBefore.GroupVersionKind())
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: "ratelimitpolicies.redline.dev"}, &crdAfter)).To(Succeed())
		g.Expect(crdAfter.GetUID()).To(Equal(crdBefore.GetUID()), "the upgrade must not recreate the CRD (that deletes every policy)")
		expectPolicy(g, ctx, admin, policy)
	})

	t.Run("uninstall keeps the CRD and policies", func(t *testing.T) {
		g := NewWithT(t)
		un := action.NewUninstall(cfg)
		un.Timeout = time.Minute
		res, err := un.Run(ReleaseName)
		g.Expect(err).NotTo(HaveOccurred(), "helm uninstall")
		g.Expect(res.Info).To(ContainSubstring("ratelimitpolicies.redline.dev"), "helm reports the kept CRD")
		var dep appsv1.Deployment
		g.Expect(apierrors.IsNotFound(admin.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "redline-manager"}, &dep))).To(BeTrue(), "the uninstall removes the manager")
		var crd unstructured.Unstructured
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: "ratelimitpolicies.redline.dev"}, &crd)).To(Succeed(), "the CRD survives helm uninstall")
		g.Expect(crd.GetDeletionTimestamp()).To(BeNil(), "the CRD is not being deleted")
		expectPolicy(g, ctx, admin, policy)
	})
}

func samplePolicy(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "samples", "checkout_per_api_key.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects(string(b))
	if err != nil || len(objs) != 1 {
		t.Fatalf("config/samples/checkout_per_api_key.yaml: %d objects, %v", len(objs), err)
	}
	return objs[0]
}

func expectPolicy(g Gomega, ctx context.Context, c client.Client, want *unstructured.Unstructured) {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(policyGVK)
	g.ExpectWithOffset(1, c.Get(ctx, client.ObjectKeyFromObject(want), got)).To(Succeed(), "policy %s/%s", want.GetNamespace(), want.GetName())
	g.ExpectWithOffset(1, got.GetUID()).To(Equal(want.GetUID()), "the policy must be the one created before, not a new one")
}

// runManagerFromChart starts the manager from the chart (startManagerFromChart) and checks it
// does its job with the chart's rights: the tenant's policy compiled into ConfigMap
// redline-policies, the chart's sidecar.* values in an injected pod.
func runManagerFromChart(t *testing.T, ctx context.Context, env *envtest.Environment, admin client.Client) {
	g := NewWithT(t)
	mgr := startManagerFromChart(t, ctx, env, admin)

	ca := webhookCABundle(g, ctx, admin)

	g.Eventually(func() error {
		return admin.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "redline-policies"}, &corev1.ConfigMap{})
	}).WithTimeout(time.Minute).Should(Succeed(), "the manager (chart's flags and RBAC) compiles the shop policy; manager log:\n%s",
		func() string { return mgr.Proc.LogTail(3000) })
	metrics, err := mgr.URL("metrics")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fmt.Sprint(metrics)).To(HavePrefix("http://127.0.0.1:"))

	// The chart's sidecar.* values, through the manager's flags, into an injected pod.
	expectInjectedDefaults(g, ctx, admin, mgr, ca)
}

// webhookCABundle is the caBundle of the pod injector, which the self-signed manager patched.
func webhookCABundle(g Gomega, ctx context.Context, admin client.Client) string {
	var hook unstructured.Unstructured
	hook.SetGroupVersionKind(schema.GroupVersionKind{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "MutatingWebhookConfiguration"})
	g.Expect(admin.Get(ctx, client.ObjectKey{Name: "redline-pod-injector"}, &hook)).To(Succeed())
	hooks, _, _ := unstructured.NestedSlice(hook.Object, "webhooks")
	ca, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "caBundle")
	g.Expect(ca).NotTo(BeEmpty(), "the self-signed manager patched the caBundle with the chart's RBAC")
	return ca
}

// startManagerFromChart starts the manager binary exactly as the chart's Deployment says (its
// args, env and mounts, through the stack's stand-in for kubelet), authenticated as the
// chart's ServiceAccount so that only the chart's RBAC applies, and waits for /readyz (which,
// in self-signed mode, needs its certificate Secret created, filled, mounted and the caBundle
// patched).
func startManagerFromChart(t *testing.T, ctx context.Context, env *envtest.Environment, admin client.Client) *stack.Container {
	g := NewWithT(t)
	var dep appsv1.Deployment
	g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "redline-manager"}, &dep)).To(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "redline-manager-0", Namespace: Namespace, Labels: dep.Spec.Template.Labels, Annotations: dep.Spec.Template.Annotations},
		Spec:       *dep.Spec.Template.Spec.DeepCopy(),
	}

	sa := "system:serviceaccount:" + Namespace + ":" + pod.Spec.ServiceAccountName
	user, err := env.AddUser(envtest.User{Name: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	dir := t.TempDir()
	kcPath := filepath.Join(dir, "kubeconfig")
	g.Expect(os.WriteFile(kcPath, kc, 0o600)).To(Succeed())
	// RBAC is what the API server enforces for that identity: no Secrets outside its namespace.
	asSA, err := client.New(user.Config(), client.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(apierrors.IsForbidden(asSA.List(ctx, &corev1.SecretList{}, client.InNamespace("kube-system")))).To(BeTrue(),
		"the manager's ServiceAccount must not list Secrets in kube-system")

	bin := filepath.Join(dir, "manager")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/manager")
	build.Dir = RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/manager: %v\n%s", err, out)
	}
	mgr, err := stack.RunContainer(ctx, admin, pod, "manager", stack.ContainerOptions{
		Dir: dir, Binary: bin,
		// What a cluster gives every pod without the spec saying so: its service account's
		// credentials (here a kubeconfig of that identity).
		ExtraEnv: []string{"KUBECONFIG=" + kcPath},
	})
	if err != nil {
		t.Fatalf("running the manager from the chart's pod spec: %v", err)
	}
	t.Cleanup(func() { _ = mgr.Stop() })
	return mgr
}
