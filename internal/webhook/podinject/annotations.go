package podinject

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// params is what a pod's annotations ask for, checked, with the manager's --sidecar-*
// defaults where the annotations say nothing.
type params struct {
	// redisTLS is how the sidecar reaches the cluster's Redis (nothing for a Redis without
	// TLS); a namespace's own Redis replaces it from RedisConfigMapName.
	redisTLS     SidecarTLS
	upstreamPort int32
	// upstreamProtocol is empty unless the pod sets it (the sidecar's default is HTTP1).
	upstreamProtocol string
	listenPort       int32
	// failureMode is empty unless the pod or the manager overrides the policies'.
	failureMode string
	// maxProcs is 0 unless the pod or the manager sets it.
	maxProcs int
	// redisPoolSize is 0 unless the pod sets it or the manager sets it.
	redisPoolSize int
	// workloadEnv reads the pod's workload's keys of RedisConfigMapName (workloadEnv).
	workloadEnv []corev1.EnvVar
	// trustedHops is 0 unless the pod or the manager sets it.
	trustedHops int
	// decisionLog is the sidecar's decision log mode; "" or off: none.
	decisionLog string
	// exposeDecisionAPI serves /v1/check and the rate limit service on the pod network.
	exposeDecisionAPI bool
	resources         corev1.ResourceRequirements
	// leaseKeys, leaseHorizon and redisTimeout come from the manager only (0 and nil: the
	// sidecar's defaults).
	leaseKeys    int
	leaseHorizon *time.Duration
	redisTimeout time.Duration
	// defaults are the manager's --sidecar-* defaults this pod got (flag name -> value),
	// recorded in the status annotation: a person reading a pod can tell a cluster-wide
	// setting from its own annotation.
	defaults map[string]string
}

// useDefault records that the pod got the manager's --flag=value.
func (p *params) useDefault(flag, value string) {
	if p.defaults == nil {
		p.defaults = map[string]string{}
	}
	p.defaults[flag] = value
}

// wantsInjection reports whether the pod opted in: by AnnotationInject or LabelInject set to
// "true", or, in a namespace that opted in, by not setting either to "false". The webhook's
// matchConditions (config/webhook) make the same test before the API server calls; this one
// is what holds when a configuration without them sends every pod.
func wantsInjection(pod *corev1.Pod, namespaceOptedIn bool) bool {
	ann, label := pod.Annotations[contract.AnnotationInject], pod.Labels[contract.LabelInject]
	if namespaceOptedIn {
		return ann != "false" && label != "false"
	}
	return ann == "true" || label == "true"
}

// parseParams reads the injection annotations of pod. The error says, for a person reading the
// admission warning, why the pod is not injected.
func parseParams(pod *corev1.Pod, cfg *Config) (params, error) {
	ann := pod.Annotations
	p := params{listenPort: contract.DefaultListenPort}

	err := parsePorts(pod, &p)
	if err != nil {
		return p, err
	}

	if p.upstreamProtocol, err = parseUpstreamProtocol(ann); err != nil {
		return p, err
	}

	if raw, ok := ann[contract.AnnotationFailureMode]; ok {
		if !slices.Contains(contract.FailureModes, raw) {
			return p, fmt.Errorf("annotation %s=%q: want one of %s", contract.AnnotationFailureMode, raw,
				strings.Join(contract.FailureModes, ", "))
		}
		p.failureMode = raw
	} else if cfg.SidecarFailureMode != "" {
		p.failureMode = cfg.SidecarFailureMode
		p.useDefault("sidecar-failure-mode", cfg.SidecarFailureMode)
	}

	if raw, ok := ann[contract.AnnotationSidecarMaxProcs]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil || n < 1 || n > contract.MaxMaxProcs {
			return p, fmt.Errorf("annotation %s=%q: want a whole number of CPUs, 1-%d", contract.AnnotationSidecarMaxProcs, raw, contract.MaxMaxProcs)
		}
		p.maxProcs = n
	} else if cfg.SidecarMaxProcs > 0 {
		p.maxProcs = cfg.SidecarMaxProcs
		p.useDefault("sidecar-max-procs", strconv.Itoa(cfg.SidecarMaxProcs))
	}

	if raw, ok := ann[contract.AnnotationRedisPoolSize]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil || n < contract.MinRedisPoolSize || n > contract.MaxRedisPoolSize {
			return p, fmt.Errorf("annotation %s=%q: want a whole number of connections per Redis node, %d-%d",
				contract.AnnotationRedisPoolSize, raw, contract.MinRedisPoolSize, contract.MaxRedisPoolSize)
		}
		p.redisPoolSize = n
	}

	if p.trustedHops, err = parseTrustedHops(ann, cfg, &p); err != nil {
		return p, err
	}

	if p.decisionLog, err = parseDecisionLog(ann); err != nil {
		return p, err
	}

	if p.exposeDecisionAPI, err = parseExposeDecisionAPI(ann); err != nil {
		return p, err
	}

	if p.resources, err = parseResources(ann, cfg, &p); err != nil {
		return p, err
	}

	if cfg.SidecarLeaseKeys > 0 {
		p.leaseKeys = cfg.SidecarLeaseKeys
		p.useDefault("sidecar-lease-keys", strconv.Itoa(cfg.SidecarLeaseKeys))
	}
	if h := cfg.SidecarLeaseHorizon; h != nil {
		p.leaseHorizon = h
		p.useDefault("sidecar-lease-horizon", h.String())
	}
	if cfg.SidecarRedisTimeout > 0 {
		p.redisTimeout = cfg.SidecarRedisTimeout
		p.useDefault("sidecar-redis-timeout", cfg.SidecarRedisTimeout.String())
	}
	return p, nil
}

// parseTrustedHops reads AnnotationTrustedHops, or takes the manager's default (recorded in p).
// "0" is a value: a pod reached directly keys on its peer in a cluster whose default trusts an
// ingress.
func parseTrustedHops(ann map[string]string, cfg *Config, p *params) (int, error) {
	raw, ok := ann[contract.AnnotationTrustedHops]
	if !ok {
		if cfg.SidecarTrustedHops > 0 {
			p.useDefault("sidecar-trusted-hops", strconv.Itoa(cfg.SidecarTrustedHops))
		}
		return cfg.SidecarTrustedHops, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || n < 0 || n > contract.MaxTrustedHops {
		return 0, fmt.Errorf("annotation %s=%q: want the number of proxies in front of the pod that append to X-Forwarded-For, 0-%d (0: the connection's peer address)",
			contract.AnnotationTrustedHops, raw, contract.MaxTrustedHops)
	}
	return n, nil
}

// parseExposeDecisionAPI reads AnnotationExposeDecisionAPI: false when the pod does not set it.
func parseExposeDecisionAPI(ann map[string]string) (bool, error) {
	raw, ok := ann[contract.AnnotationExposeDecisionAPI]
	if !ok {
		return false, nil
	}
	switch strings.TrimSpace(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("annotation %s=%q: want \"true\" (serve /v1/check and the rate limit service on the pod network) or \"false\"",
		contract.AnnotationExposeDecisionAPI, raw)
}

// parseUpstreamProtocol reads AnnotationUpstreamProtocol: "" when the pod does not set it.
func parseUpstreamProtocol(ann map[string]string) (string, error) {
	raw, ok := ann[contract.AnnotationUpstreamProtocol]
	if !ok {
		return "", nil
	}
	v := strings.TrimSpace(raw)
	if !slices.Contains(contract.UpstreamProtocols, v) {
		return "", fmt.Errorf("annotation %s=%q: want one of %s (HTTP1: HTTP/1.1; H2C: HTTP/2 over cleartext, a gRPC server's plaintext port; HTTPS: TLS)",
			contract.AnnotationUpstreamProtocol, raw, strings.Join(contract.UpstreamProtocols, ", "))
	}
	return v, nil
}

func parsePort(name, raw string) (int32, error) {
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("annotation %s=%q: want a port number 1-65535", name, raw)
	}
	return int32(n), nil
}

// portOwner returns the name of a container (other than the sidecar) that declares port, or "".
func portOwner(pod *corev1.Pod, port int32) string {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.Name == contract.ContainerName {
				continue
			}
			for _, cp := range c.Ports {
				if cp.ContainerPort == port {
					return c.Name
				}
			}
		}
	}
	return ""
}

// parseResources applies the resource annotations to the configured defaults. The memory
// annotation sets request and limit alike: a sidecar that exceeds what it asked for is better
// restarted than left to push the application out of its node. The manager's defaults that
// differ from the built-in ones are recorded in p.
func parseResources(ann map[string]string, cfg *Config, p *params) (corev1.ResourceRequirements, error) {
	cpu, memReq, memLim := cfg.DefaultCPURequest, cfg.DefaultMemoryRequest, cfg.DefaultMemoryLimit
	if raw, ok := ann[contract.AnnotationSidecarCPU]; ok {
		q, err := parsePositive(contract.AnnotationSidecarCPU, raw)
		if err != nil {
			return corev1.ResourceRequirements{}, err
		}
		cpu = q
	} else if !cpu.Equal(builtinCPURequest) {
		p.useDefault("sidecar-cpu-request", cpu.String())
	}
	if raw, ok := ann[contract.AnnotationSidecarMemory]; ok {
		q, err := parsePositive(contract.AnnotationSidecarMemory, raw)
		if err != nil {
			return corev1.ResourceRequirements{}, err
		}
		memReq, memLim = q, q
	} else {
		if !memReq.Equal(builtinMemoryRequest) {
			p.useDefault("sidecar-memory-request", memReq.String())
		}
		if !memLim.Equal(builtinMemoryLimit) {
			p.useDefault("sidecar-memory-limit", memLim.String())
		}
	}
	r := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	if !cpu.IsZero() {
		r.Requests[corev1.ResourceCPU] = cpu
	}
	if !memReq.IsZero() {
		r.Requests[corev1.ResourceMemory] = memReq
	}
	if !memLim.IsZero() {
		r.Limits[corev1.ResourceMemory] = memLim
	}
	return r, nil
}

func parsePositive(name, raw string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(raw))
	if err != nil || q.Sign() <= 0 {
		return resource.Quantity{}, fmt.Errorf("annotation %s=%q: want a positive resource quantity such as 100m or 64Mi", name, raw)
	}
	return q, nil
}

// parseDecisionLog reads AnnotationDecisionLog: the sidecar's decision log mode, "" without it.
func parseDecisionLog(ann map[string]string) (string, error) {
	raw, ok := ann[contract.AnnotationDecisionLog]
	if !ok {
		return "", nil
	}
	switch v := strings.TrimSpace(raw); v {
	case contract.DecisionLogOff, contract.DecisionLogRefused, contract.DecisionLogAll:
		return v, nil
	}
	return "", fmt.Errorf("annotation %s=%q: want %s, %s or %s", contract.AnnotationDecisionLog, raw,
		contract.DecisionLogOff, contract.DecisionLogRefused, contract.DecisionLogAll)
}

// parsePorts reads the application's and the sidecar's ports into p and checks that they
// differ, are not the sidecar's own, and that no other container declares the listen port.
func parsePorts(pod *corev1.Pod, p *params) error {
	ann := pod.Annotations
	raw, ok := ann[contract.AnnotationUpstreamPort]
	if !ok {
		return fmt.Errorf("annotation %s is missing: it names the application port the sidecar forwards to", contract.AnnotationUpstreamPort)
	}
	port, err := parsePort(contract.AnnotationUpstreamPort, raw)
	if err != nil {
		return err
	}
	p.upstreamPort = port

	if raw, ok := ann[contract.AnnotationListenPort]; ok {
		if p.listenPort, err = parsePort(contract.AnnotationListenPort, raw); err != nil {
			return err
		}
	}
	if p.listenPort == p.upstreamPort {
		return fmt.Errorf("annotation %s=%d equals %s: the sidecar and the application cannot listen on the same port",
			contract.AnnotationListenPort, p.listenPort, contract.AnnotationUpstreamPort)
	}
	for _, reserved := range []int32{contract.AdminPort, contract.GRPCPort, contract.CheckPort} {
		if p.listenPort == reserved || p.upstreamPort == reserved {
			return fmt.Errorf("port %d is taken by the sidecar (admin %d, Envoy rate limit service %d, decision API %d): use another %s/%s",
				reserved, contract.AdminPort, contract.GRPCPort, contract.CheckPort, contract.AnnotationListenPort, contract.AnnotationUpstreamPort)
		}
	}
	if owner := portOwner(pod, p.listenPort); owner != "" {
		return fmt.Errorf("listen port %d is already declared by container %q: set %s to a free port",
			p.listenPort, owner, contract.AnnotationListenPort)
	}
	return nil
}
