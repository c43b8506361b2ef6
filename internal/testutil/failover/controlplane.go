package failover

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// controlPlane is the etcd and kube-apiserver the manager of every TenantACL cell runs
// against, with the namespaces and the policy it needs; started on the first such cell.
type controlPlane struct {
	env        *envtest.Environment
	client     client.Client
	kubeconfig string
}

// startControlPlane starts etcd and kube-apiserver with the CRDs and the webhook registration
// (the manager's webhook server needs a certificate, which envtest makes), the manager's
// namespace and the cells' namespace with the policy the sidecars enforce: a namespace gets
// its Redis user when it has a policy.
func (e *Env) startControlPlane(ctx context.Context) (*controlPlane, error) {
	e.cpOnce.Do(func() {
		e.cp, e.cpErr = e.newControlPlane(ctx)
	})
	return e.cp, e.cpErr
}

func (e *Env) newControlPlane(ctx context.Context) (*controlPlane, error) {
	root, err := stack.RepoRoot()
	if err != nil {
		return nil, err
	}
	assets, err := stack.ControlPlaneAssets(root, e.o.InstallTools)
	if err != nil {
		return nil, err
	}
	// envtest logs through controller-runtime's logger, which nothing else here sets.
	ctrllog.SetLogger(logr.Discard())
	e.o.Progress("starting etcd and kube-apiserver (envtest)")
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}},
		Scheme:                stack.Scheme,
		// Two cores shared with the sidecars and Redis: give the processes time.
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting etcd and kube-apiserver from %s: %w", assets, err)
	}
	cp := &controlPlane{env: env, kubeconfig: filepath.Join(e.o.Dir, "kubeconfig")}
	fail := func(err error) (*controlPlane, error) {
		_ = env.Stop()
		return nil, err
	}
	if cp.client, err = client.New(cfg, client.Options{Scheme: stack.Scheme}); err != nil {
		return fail(fmt.Errorf("creating an API client: %w", err))
	}
	if err := os.WriteFile(cp.kubeconfig, env.KubeConfig, 0o600); err != nil {
		return fail(fmt.Errorf("writing the kubeconfig: %w", err))
	}
	for _, ns := range []string{ManagerNamespace, Namespace} {
		if err := cp.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fail(fmt.Errorf("creating namespace %s: %w", ns, err))
		}
	}
	if err := cp.client.Create(ctx, e.policyObject()); err != nil {
		return fail(fmt.Errorf("creating the cells' RateLimitPolicy: %w", err))
	}
	return cp, nil
}

// policyObject is the RateLimitPolicy of the document the sidecars read (writeSidecarFiles):
// the same rules, so that the namespace the manager provisions has the policy its sidecars
// enforce.
func (e *Env) policyObject() *v1alpha1.RateLimitPolicy {
	window := metav1.Duration{Duration: e.o.Window}
	rule := func(name, alg string, limit int64) v1alpha1.Rule {
		return v1alpha1.Rule{Name: name, Key: []v1alpha1.KeyPart{{Header: "x-key"}}, Algorithm: v1alpha1.Algorithm(alg),
			Limit: v1alpha1.Limit{Requests: limit, Window: window}, Mode: v1alpha1.Enforce}
	}
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Policy},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "failover"}},
			FailureMode:    v1alpha1.FailureModeClosed,
		},
	}
	for _, r := range e.o.Rules {
		p.Spec.Rules = append(p.Spec.Rules, rule(r.Name, r.Algorithm, r.Limit))
	}
	p.Spec.Rules = append(p.Spec.Rules, rule(ProbeRule, "FixedWindow", probeLimit))
	return p
}

// closeControlPlane stops etcd and kube-apiserver, if they were started.
func (e *Env) closeControlPlane() {
	if e.cp != nil {
		_ = e.cp.env.Stop()
	}
}
