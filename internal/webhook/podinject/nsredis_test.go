package podinject_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// nsBackends is a BackendResolver with a RedisBackend for the namespaces listed, the manager's
// Redis for the others.
type nsBackends map[string]backend.NamespaceRedis

func (b nsBackends) Redis(_ context.Context, ns string) (backend.NamespaceRedis, error) {
	return b[ns], nil
}

func podJSON(pod *corev1.Pod) string {
	GinkgoHelper()
	raw, err := json.Marshal(pod)
	Expect(err).NotTo(HaveOccurred())
	return string(raw)
}

// reconcileRedisConfigMap runs the manager's reconciler of the sidecars' Redis settings for ns.
func reconcileRedisConfigMap(ctx context.Context, cfg podinject.Config, ns string) {
	GinkgoHelper()
	r := &podinject.NamespaceRedisReconciler{Client: k8s, Reader: k8s, Config: &cfg}
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: ns}})
	Expect(err).NotTo(HaveOccurred())
}

func redisConfigMap(ctx context.Context, ns string) (*corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: podinject.RedisConfigMapName}, &cm)
	return &cm, err
}

var envReference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// kubeletView is the sidecar's environment (literal values and ConfigMap keys; no other
// sources) and its args with $(VAR) references expanded, as kubelet gives them.
func kubeletView(ctx context.Context, pod *corev1.Pod) (map[string]string, []string) {
	GinkgoHelper()
	sc := sidecarOf(pod)
	env := map[string]string{}
	for _, e := range sc.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			optional := ref.Optional != nil && *ref.Optional
			var cm corev1.ConfigMap
			err := k8s.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &cm)
			if optional && client.IgnoreNotFound(err) == nil && err != nil {
				continue // kubelet leaves the variable unset
			}
			Expect(err).NotTo(HaveOccurred())
			v, ok := cm.Data[ref.Key]
			if optional && !ok {
				continue
			}
			Expect(ok).To(BeTrue(), "key %s of ConfigMap %s", ref.Key, ref.Name)
			env[e.Name] = v
		}
	}
	args := make([]string, 0, len(sc.Args))
	for _, a := range sc.Args {
		args = append(args, envReference.ReplaceAllStringFunc(a, func(ref string) string {
			name := envReference.FindStringSubmatch(ref)[1]
			Expect(env).To(HaveKey(name), "the argument %s refers to an undefined variable", a)
			return env[name]
		}))
	}
	return env, args
}

var _ = Describe("The sidecars' Redis settings in each namespace", func() {
	const onBackend, onDefault = "redis-settings-backend", "redis-settings-default"
	BeforeEach(func() {
		createNamespace(onBackend)
		createNamespace(onDefault)
	})

	config := func(nr backend.NamespaceRedis) podinject.Config {
		cfg := tlsConfig()
		cfg.Backends = nsBackends{onBackend: nr}
		return cfg
	}

	It("are written where a RedisBackend serves the namespace only, and kept true", func(ctx SpecContext) {
		cfg := config(backend.NamespaceRedis{URL: "rediss://orders.redis:6380", Backend: true, TLSServerName: "orders.internal", TLSMinVersion: "1.2"})
		reconcileRedisConfigMap(ctx, cfg, onBackend)
		reconcileRedisConfigMap(ctx, cfg, onDefault)
		cm, err := redisConfigMap(ctx, onBackend)
		Expect(err).NotTo(HaveOccurred())
		Expect(cm.Data).To(Equal(map[string]string{
			podinject.RedisConfigMapURLKey: "rediss://orders.redis:6380", podinject.RedisConfigMapTLSServerNameKey: "orders.internal",
			podinject.RedisConfigMapTLSMinVersionKey: "1.2", podinject.RedisConfigMapTLSCAFileKey: tlsFile(contract.RedisTLSCAKey),
			podinject.RedisConfigMapTLSCertFileKey: tlsFile(contract.RedisTLSCertKey), podinject.RedisConfigMapTLSKeyFileKey: tlsFile(contract.RedisTLSKeyKey),
		}))
		Expect(cm.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "redline"))
		_, err = redisConfigMap(ctx, onDefault)
		Expect(err).To(Satisfy(func(err error) bool { return client.IgnoreNotFound(err) == nil && err != nil }),
			"nothing is written where the manager's Redis has always served")

		By("a tenant pointing its sidecars elsewhere and making the ConfigMap immutable: undone")
		cm.Data[podinject.RedisConfigMapURLKey] = "redis://mine:6379"
		cm.Immutable = new(true)
		Expect(k8s.Update(ctx, cm)).To(Succeed())
		reconcileRedisConfigMap(ctx, cfg, onBackend)
		cm, err = redisConfigMap(ctx, onBackend)
		Expect(err).NotTo(HaveOccurred())
		Expect(cm.Data).To(HaveKeyWithValue(podinject.RedisConfigMapURLKey, "rediss://orders.redis:6380"))
		Expect(cm.Immutable == nil || !*cm.Immutable).To(BeTrue(), "the ConfigMap is mutable again")

		By("the namespace leaving its backend: its ConfigMap stays, with the manager's Redis, for the sidecars injected before")
		reconcileRedisConfigMap(ctx, config(backend.NamespaceRedis{}), onBackend)
		cm, err = redisConfigMap(ctx, onBackend)
		Expect(err).NotTo(HaveOccurred())
		Expect(cm.Data).To(Equal(map[string]string{
			podinject.RedisConfigMapURLKey: cfg.RedisURL, podinject.RedisConfigMapTLSServerNameKey: cfg.SidecarRedisTLS.ServerName,
			podinject.RedisConfigMapTLSMinVersionKey: cfg.SidecarRedisTLS.MinVersion, podinject.RedisConfigMapTLSCAFileKey: tlsFile(contract.RedisTLSCAKey),
			podinject.RedisConfigMapTLSCertFileKey: tlsFile(contract.RedisTLSCertKey), podinject.RedisConfigMapTLSKeyFileKey: tlsFile(contract.RedisTLSKeyKey),
		}))
	})
})

// tlsFile is the path of key in the sidecar's mount of the Redis TLS Secret.
func tlsFile(key string) string { return filepath.Join(contract.RedisTLSDir, key) }
