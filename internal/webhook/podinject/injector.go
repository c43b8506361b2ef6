package podinject

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Injector decides whether a pod gets the sidecar and applies the mutator chain.
type Injector struct {
	cfg      Config
	native   bool
	mutators []mutator
	// sizer sizes pools from the connection budget; nil leaves them to the annotation.
	sizer *poolSizer
}

// NewInjector returns an Injector for cfg. native selects a native sidecar (an init container
// with restartPolicy Always) over a regular container.
func NewInjector(cfg Config, native bool) *Injector {
	return &Injector{cfg: cfg, native: native, mutators: defaultMutators()}
}

// Native reports whether the Injector injects native sidecars.
func (in *Injector) Native() bool { return in.native }

// ErrSkipped is returned by Inject for a pod that is left alone with nothing to tell its owner:
// it did not opt in, or it is already injected.
var ErrSkipped = errors.New("not injected")

// Inject returns the injected copy of pod, or pod itself when it is left unchanged; err then
// says why, and is ErrSkipped when there is nothing to warn about. warnings are for the
// person creating the pod when it is injected (a pool that overspends the connection budget).
// pod is never modified.
func (in *Injector) Inject(ctx context.Context, pod *corev1.Pod) (out *corev1.Pod, warnings []string, err error) {
	return in.inject(ctx, pod, false)
}

// inject is Inject for a pod of a namespace that opted in when namespaceOptedIn.
func (in *Injector) inject(ctx context.Context, pod *corev1.Pod, namespaceOptedIn bool) (out *corev1.Pod, warnings []string, err error) {
	if !wantsInjection(pod, namespaceOptedIn) {
		return pod, nil, ErrSkipped
	}
	if _, done := pod.Annotations[contract.AnnotationInjected]; done {
		return pod, nil, ErrSkipped
	}
	if in.cfg.SidecarImage == "" {
		return pod, nil, errors.New("the manager has no --sidecar-image, so injection is off")
	}
	p, err := parseParams(pod, &in.cfg)
	if err != nil {
		return pod, nil, err
	}
	// Anyone who reaches the webhook can send it a review of a pod in any namespace: the
	// patch depends on the pod and the manager's flags alone. Which Redis serves the
	// namespace, whether it uses TLS and its names reach the sidecar through the ConfigMap the
	// manager writes in the pod's own namespace, which every patch names alike
	// (namespaceRedisEnv, NamespaceRedisReconciler); the cluster's Redis is the default.
	if redisconn.URLUsesTLS(in.cfg.RedisURL) {
		p.redisTLS = in.cfg.SidecarRedisTLS // a Redis without TLS gets no TLS flags
	} else {
		p.redisTLS = SidecarTLS{Secret: in.cfg.SidecarRedisTLS.Secret, ClientCertificate: in.cfg.SidecarRedisTLS.ClientCertificate}
	}
	// The budget's pool and the fallback's replicas reach the sidecar from its workload's
	// keys of the namespace's ConfigMap, which the patch names and never carries: a review
	// of another namespace's pod learns nothing of its workload (workloadkeys.go).
	explicitPool := p.redisPoolSize > 0
	p.workloadEnv = workloadEnv(pod, explicitPool)
	if explicitPool {
		warnings = in.sizer.warn(ctx, pod, p.redisPoolSize, in.budgetOf)
	} else if in.cfg.SidecarRedisPoolSize > 0 {
		// The manager's default, until (and unless) the budget's pool is in the ConfigMap:
		// also what the budget reconciler counts for a workload it cannot size.
		p.redisPoolSize = in.cfg.SidecarRedisPoolSize
		p.useDefault("sidecar-redis-pool-size", strconv.Itoa(p.redisPoolSize))
	}
	inj := &injection{
		container: sidecarContainer(&in.cfg, p, in.native),
		volumes:   sidecarVolumes(&in.cfg, p),
		native:    in.native,
		upstream:  p.upstreamPort,
		defaults:  p.defaults,
	}
	out = pod.DeepCopy()
	for _, m := range in.mutators {
		if err := m.mutate(out, inj); err != nil {
			return pod, nil, fmt.Errorf("applying the %s mutator: %w", m.name(), err)
		}
	}
	return out, warnings, nil
}

// budgetOf is the connection budget of the Redis that serves namespace ns, for the warning
// about an overspending pool, which only the API server is given (poolSizer.warn); nil when
// it is unknown.
func (in *Injector) budgetOf(ctx context.Context, ns string) *connbudget.Publisher {
	if in.cfg.Backends == nil {
		return in.cfg.Budget
	}
	nr, err := in.cfg.Backends.Redis(ctx, ns)
	if err != nil {
		return nil
	}
	return nr.Budget
}
