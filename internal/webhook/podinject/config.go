// Package podinject is the mutating admission webhook that injects Redline's sidecar into pods
// that opt in with the redline.dev/inject annotation.
//
// A pod passes through a chain of small mutators (container, volumes, status annotation), in
// the manner of the OpenTelemetry operator's pod webhook. Any problem, from a bad annotation to
// a panic, admits the pod unchanged with an admission warning: the webhook never blocks a pod.
package podinject

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Certificate modes of the webhook server.
const (
	// CertModeCertManager serves the certificate cert-manager writes into the mounted Secret;
	// cert-manager's cainjector fills the caBundle.
	CertModeCertManager = "cert-manager"
	// CertModeSelfSigned makes the manager create a CA and serving certificate itself, keep them
	// in a Secret shared by its replicas and patch the caBundle.
	CertModeSelfSigned = "self-signed"
)

// Native sidecar settings.
const (
	NativeSidecarsAuto  = "auto"
	NativeSidecarsTrue  = "true"
	NativeSidecarsFalse = "false"
)

// Path is where the webhook is served for pods that opted in (config/webhook's
// pod-injector entry).
const Path = "/mutate-v1-pod"

// NamespacePath is where it is served for the pods of namespaces that opted in
// (namespace-injector).
const NamespacePath = "/mutate-v1-pod-namespace"

// Config is the webhook's configuration, set from the manager's flags.
type Config struct {
	// SidecarImage is the sidecar's image. Injection is off when it is empty.
	SidecarImage string
	// SidecarImagePullPolicy is the sidecar's image pull policy ("" leaves the default).
	SidecarImagePullPolicy string
	// RedisURL is given to sidecars; empty means the manager's own Redis URL.
	RedisURL string
	// RedisSecret names the Secret (in the pod's namespace) with the Redis password under key
	// "password". Empty leaves the password variable out.
	RedisSecret string
	// SidecarRedisTLS is how sidecars reach a rediss:// Redis: the namespace's TLS Secret,
	// the server name, the minimum version (--sidecar-redis-tls-*).
	SidecarRedisTLS SidecarTLS
	// NativeSidecars is auto, true or false.
	NativeSidecars string

	// Port of the webhook server.
	Port int
	// CertDir holds tls.crt and tls.key.
	CertDir string
	// CertMode is CertModeCertManager or CertModeSelfSigned.
	CertMode string
	// ServiceName and Namespace of the webhook's Service: the serving certificate's DNS names
	// and the self-signed Secret's namespace.
	ServiceName, Namespace string
	// CertSecret names the Secret that keeps the self-signed CA and certificate.
	CertSecret string
	// WebhookConfigName names the MutatingWebhookConfiguration whose caBundle is patched in
	// self-signed mode.
	WebhookConfigName string
	// ClientCAFile, when set, makes the webhook server answer only clients presenting a
	// certificate this CA signed (the API server, where its admission configuration gives it
	// one); ClientNames, when set, only those whose common name or a DNS name is listed.
	ClientCAFile string
	ClientNames  []string

	// Budget is the connection budget the controller publishes in the same manager (not a
	// flag): with it, and the webhook answering only verified clients (ClientCAFile), a pod
	// whose redline.dev/redis-pool-size overspends its workload's share is warned.
	Budget *connbudget.Publisher
	// Backends, when set (not a flag), tells which Redis serves a pod's namespace: its URL
	// replaces RedisURL, and its connection budget Budget. With it the manager writes each
	// namespace's RedisConfigMapName, where the pools the budget gives the namespace's
	// workloads are (workloadData); without it pools are the annotation's or the default.
	Backends BackendResolver
	// BudgetLookupTimeout bounds the workload lookups of the overspend warning (default 1s);
	// past it, or on any lookup error, no warning is given.
	BudgetLookupTimeout time.Duration

	// DefaultCPURequest, DefaultMemoryRequest and DefaultMemoryLimit are the sidecar's resources
	// unless the pod's annotations say otherwise (--sidecar-cpu-request,
	// --sidecar-memory-request, --sidecar-memory-limit).
	DefaultCPURequest, DefaultMemoryRequest, DefaultMemoryLimit resource.Quantity

	// The cluster-wide defaults below (--sidecar-*) apply to every injected pod whose
	// annotations do not set the same thing; the zero value of each passes nothing, which
	// leaves the sidecar's own default.

	// SidecarFailureMode is one of contract.FailureModes, or empty: each policy's own.
	SidecarFailureMode string
	// SidecarMaxProcs is the sidecar's GOMAXPROCS, 1 to contract.MaxMaxProcs.
	SidecarMaxProcs int
	// SidecarRedisPoolSize is the most the connection budget sizes a pool to, and the pool of
	// pods it cannot size (before maxclients is known, pods of no counted workload): between
	// contract.MinRedisPoolSize and contract.MaxRedisPoolSize; 0 is
	// contract.DefaultRedisPoolSize. The budget reconciler must be given the same number
	// (controller.Config.SidecarRedisPoolSize), so that it counts what is injected.
	SidecarRedisPoolSize int
	// SidecarLeaseKeys bounds the sidecar's lease table, 1 to contract.MaxLeaseKeys.
	SidecarLeaseKeys int
	// SidecarLeaseHorizon sizes the sidecar's leases (0 turns them off), at most
	// MaxSidecarLeaseHorizon; nil leaves the sidecar's 2s.
	SidecarLeaseHorizon *time.Duration
	// SidecarRedisTimeout is the sidecar's Redis timeout, MinSidecarRedisTimeout to
	// MaxSidecarRedisTimeout.
	SidecarRedisTimeout time.Duration
	// SidecarTrustedHops is how many proxies in front of every injected pod append to
	// X-Forwarded-For and are trusted to (the sidecar's --trusted-hops), 0 to
	// contract.MaxTrustedHops; 0 keys ForwardedFor on the connection's peer.
	SidecarTrustedHops int
}

// Bounds of the cluster-wide sidecar defaults.
const (
	// MaxSidecarLeaseHorizon: a lease is sized from this long's local demand and an idle one
	// goes back after it; beyond a minute leases stop following demand and sit idle.
	MaxSidecarLeaseHorizon = time.Minute
	// MinSidecarRedisTimeout and MaxSidecarRedisTimeout bound the sidecar's Redis timeout:
	// below a millisecond a loaded Redis answers too late for every call; above 10s each
	// request waits that long on a hung Redis before its failure mode answers.
	MinSidecarRedisTimeout = time.Millisecond
	MaxSidecarRedisTimeout = 10 * time.Second
)

// The sidecar's resources when neither the manager's flags nor the pod's annotations set them.
var (
	builtinCPURequest    = resource.MustParse("50m")
	builtinMemoryRequest = resource.MustParse("32Mi")
	builtinMemoryLimit   = resource.MustParse("64Mi")
)

// RedisPoolCeiling is SidecarRedisPoolSize, or contract.DefaultRedisPoolSize when it is 0.
func (c *Config) RedisPoolCeiling() int {
	if c.SidecarRedisPoolSize > 0 {
		return c.SidecarRedisPoolSize
	}
	return contract.DefaultRedisPoolSize
}

// DefaultConfig returns the defaults the flags start from.
func DefaultConfig() Config {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "redline-system"
	}
	return Config{
		RedisSecret:          "redline-redis",
		NativeSidecars:       NativeSidecarsAuto,
		Port:                 9443,
		CertDir:              "/tmp/k8s-webhook-server/serving-certs",
		CertMode:             CertModeCertManager,
		ServiceName:          "redline-webhook-service",
		Namespace:            ns,
		CertSecret:           "redline-webhook-self-signed",
		WebhookConfigName:    "redline-pod-injector",
		DefaultCPURequest:    builtinCPURequest.DeepCopy(),
		DefaultMemoryRequest: builtinMemoryRequest.DeepCopy(),
		DefaultMemoryLimit:   builtinMemoryLimit.DeepCopy(),
	}
}

// BindFlags registers the webhook's flags on fs, with c's values as defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.SidecarImage, "sidecar-image", c.SidecarImage, "Image of the injected sidecar. Empty turns pod injection off.")
	fs.StringVar(&c.SidecarImagePullPolicy, "sidecar-image-pull-policy", c.SidecarImagePullPolicy, "Pull policy of the sidecar image (Always, IfNotPresent, Never; empty: the cluster default).")
	fs.StringVar(&c.RedisURL, "sidecar-redis-url", c.RedisURL, "Redis URL given to sidecars (default: the manager's --redis-url).")
	fs.StringVar(&c.RedisSecret, "sidecar-redis-secret", c.RedisSecret, "Secret in each pod's namespace whose key 'password' sidecars use as the Redis password (optional Secret; empty: none).")
	c.SidecarRedisTLS.bindFlags(fs)
	fs.StringVar(&c.NativeSidecars, "native-sidecars", c.NativeSidecars, "Inject the sidecar as a native sidecar (init container with restartPolicy Always): auto (when the API server is 1.29+), true or false.")
	fs.StringVar(&c.SidecarFailureMode, "sidecar-failure-mode", c.SidecarFailureMode, "Failure mode of every injected sidecar whose pod does not set "+contract.AnnotationFailureMode+": "+strings.Join(contract.FailureModes, ", ")+" (empty: each policy's own failureMode).")
	fs.Var(quantityValue{&c.DefaultCPURequest}, "sidecar-cpu-request", "CPU request of the sidecar when its pod does not set "+contract.AnnotationSidecarCPU+".")
	fs.Var(quantityValue{&c.DefaultMemoryRequest}, "sidecar-memory-request", "Memory request of the sidecar when its pod does not set "+contract.AnnotationSidecarMemory+" (at most --sidecar-memory-limit).")
	fs.Var(quantityValue{&c.DefaultMemoryLimit}, "sidecar-memory-limit", "Memory limit of the sidecar when its pod does not set "+contract.AnnotationSidecarMemory+"; Go's memory limit is 85% of it.")
	fs.IntVar(&c.SidecarMaxProcs, "sidecar-max-procs", c.SidecarMaxProcs, fmt.Sprintf("CPUs the sidecar runs Go code on (GOMAXPROCS, 1-%d) when its pod does not set %s (0: the sidecar's default, %d).", contract.MaxMaxProcs, contract.AnnotationSidecarMaxProcs, contract.DefaultMaxProcs))
	fs.IntVar(&c.SidecarRedisPoolSize, "sidecar-redis-pool-size", c.SidecarRedisPoolSize, fmt.Sprintf("Most Redis connections per node the connection budget gives a sidecar, and the pool of pods it cannot size, when the pod does not set %s (%d-%d; 0: %d).", contract.AnnotationRedisPoolSize, contract.MinRedisPoolSize, contract.MaxRedisPoolSize, contract.DefaultRedisPoolSize))
	fs.IntVar(&c.SidecarLeaseKeys, "sidecar-lease-keys", c.SidecarLeaseKeys, fmt.Sprintf("Most keys holding a lease at once in each sidecar, up to %d bytes each (1-%d; 0: the sidecar's default, %d); the lease table must fit in half of --sidecar-memory-limit.", contract.LeaseKeyBytes, contract.MaxLeaseKeys, contract.DefaultLeaseKeys))
	fs.Func("sidecar-lease-horizon", fmt.Sprintf("Sidecars' lease horizon: leases of about this long's local demand, 0 turns leases off (at most %s; unset: the sidecar's default, %ds).", MaxSidecarLeaseHorizon, contract.DefaultLeaseHorizonSeconds), func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as 2s, or 0 to turn leases off: %w", err)
		}
		c.SidecarLeaseHorizon = &d
		return nil
	})
	fs.DurationVar(&c.SidecarRedisTimeout, "sidecar-redis-timeout", c.SidecarRedisTimeout, fmt.Sprintf("Sidecars' Redis timeout (the wait for a free connection included), past which the failure mode answers (%s-%s; 0: the sidecar's default, %dms).", MinSidecarRedisTimeout, MaxSidecarRedisTimeout, contract.DefaultRedisTimeoutMillis))
	fs.IntVar(&c.SidecarTrustedHops, "sidecar-trusted-hops", c.SidecarTrustedHops, fmt.Sprintf("Proxies in front of every injected pod (a load balancer, an ingress controller) that append to X-Forwarded-For, when the pod does not set %s (0-%d): the ForwardedFor key part is the entry this many from the right. 0: the connection's peer address. More than the real chain lets every client choose its key.", contract.AnnotationTrustedHops, contract.MaxTrustedHops))
	fs.IntVar(&c.Port, "webhook-port", c.Port, "Port of the admission webhook server.")
	fs.StringVar(&c.CertDir, "webhook-cert-dir", c.CertDir, "Directory with the webhook's tls.crt and tls.key.")
	fs.StringVar(&c.CertMode, "webhook-cert-mode", c.CertMode, "Who provides the webhook's certificate: cert-manager (mounted Secret, cainjector) or self-signed (the manager creates and rotates it and patches the caBundle).")
	fs.StringVar(&c.ServiceName, "webhook-service-name", c.ServiceName, "Service in front of the webhook (the certificate's DNS names).")
	fs.StringVar(&c.Namespace, "webhook-namespace", c.Namespace, "Namespace of the webhook Service and of the self-signed certificate Secret (env POD_NAMESPACE when set).")
	fs.StringVar(&c.CertSecret, "webhook-cert-secret", c.CertSecret, "Secret holding the self-signed CA and serving certificate (self-signed mode).")
	fs.StringVar(&c.ClientCAFile, "webhook-client-ca-file", c.ClientCAFile, "PEM CA file: the webhook answers only clients with a certificate it signed, for clusters whose API server presents a client certificate to admission webhooks (read again when it changes; empty: any client, see the security guide).")
	fs.Func("webhook-client-names", "Comma-separated names the webhook's client certificate must have as its common name or a DNS name, with --webhook-client-ca-file (empty: any certificate the CA signed).", func(v string) error {
		c.ClientNames = nil
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.ClientNames = append(c.ClientNames, n)
			}
		}
		return nil
	})
	fs.StringVar(&c.WebhookConfigName, "webhook-config-name", c.WebhookConfigName, "MutatingWebhookConfiguration whose caBundle is patched (self-signed mode).")
}

// Validate reports configuration mistakes, all at once.
func (c *Config) Validate() error {
	var errs []error
	switch c.NativeSidecars {
	case NativeSidecarsAuto, NativeSidecarsTrue, NativeSidecarsFalse:
	default:
		errs = append(errs, fmt.Errorf("--native-sidecars=%q: want auto, true or false", c.NativeSidecars))
	}
	switch c.CertMode {
	case CertModeCertManager:
	case CertModeSelfSigned:
		if c.Namespace == "" || c.ServiceName == "" || c.CertSecret == "" || c.WebhookConfigName == "" {
			errs = append(errs, errors.New("self-signed certificates need --webhook-namespace, --webhook-service-name, --webhook-cert-secret and --webhook-config-name"))
		}
	default:
		errs = append(errs, fmt.Errorf("--webhook-cert-mode=%q: want cert-manager or self-signed", c.CertMode))
	}
	switch c.SidecarImagePullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		errs = append(errs, fmt.Errorf("--sidecar-image-pull-policy=%q: want Always, IfNotPresent or Never", c.SidecarImagePullPolicy))
	}
	if c.ClientCAFile != "" {
		if _, err := newClientVerifier(c.ClientCAFile, c.ClientNames); err != nil {
			errs = append(errs, fmt.Errorf("--webhook-client-ca-file: %w", err))
		}
	} else if len(c.ClientNames) > 0 {
		errs = append(errs, errors.New("--webhook-client-names needs --webhook-client-ca-file, the CA that signs the clients' certificates"))
	}
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("--webhook-port=%d: want 1-65535", c.Port))
	}
	errs = append(errs, c.SidecarRedisTLS.validate(c.RedisURL)...)
	return errors.Join(append(errs, c.validateSidecarDefaults()...)...)
}

// validateSidecarDefaults checks the --sidecar-* defaults with the bounds the pod annotations
// and the sidecar itself have: a manager that accepted a bad one would inject it into every
// pod (or, for resources, have every injected pod refused by the API server).
func (c *Config) validateSidecarDefaults() []error {
	var errs []error
	if c.SidecarFailureMode != "" && !slices.Contains(contract.FailureModes, c.SidecarFailureMode) {
		errs = append(errs, fmt.Errorf("--sidecar-failure-mode=%q: want one of %s (empty: each policy's own failureMode)",
			c.SidecarFailureMode, strings.Join(contract.FailureModes, ", ")))
	}
	for _, q := range []struct {
		flag string
		v    resource.Quantity
	}{{"sidecar-cpu-request", c.DefaultCPURequest}, {"sidecar-memory-request", c.DefaultMemoryRequest}, {"sidecar-memory-limit", c.DefaultMemoryLimit}} {
		if q.v.Sign() <= 0 {
			errs = append(errs, fmt.Errorf("--%s=%s: want a positive quantity such as 100m or 64Mi", q.flag, q.v.String()))
		}
	}
	if c.DefaultMemoryRequest.Cmp(c.DefaultMemoryLimit) > 0 {
		// The API server refuses a container whose request exceeds its limit.
		errs = append(errs, fmt.Errorf("--sidecar-memory-request=%s is more than --sidecar-memory-limit=%s",
			c.DefaultMemoryRequest.String(), c.DefaultMemoryLimit.String()))
	}
	if c.SidecarMaxProcs != 0 && (c.SidecarMaxProcs < 1 || c.SidecarMaxProcs > contract.MaxMaxProcs) {
		errs = append(errs, fmt.Errorf("--sidecar-max-procs=%d: want 1-%d CPUs (0: the sidecar's default, %d)",
			c.SidecarMaxProcs, contract.MaxMaxProcs, contract.DefaultMaxProcs))
	}
	if c.SidecarRedisPoolSize != 0 && (c.SidecarRedisPoolSize < contract.MinRedisPoolSize || c.SidecarRedisPoolSize > contract.MaxRedisPoolSize) {
		errs = append(errs, fmt.Errorf("--sidecar-redis-pool-size=%d: want %d-%d connections per Redis node (0: %d)",
			c.SidecarRedisPoolSize, contract.MinRedisPoolSize, contract.MaxRedisPoolSize, contract.DefaultRedisPoolSize))
	}
	if c.SidecarLeaseKeys != 0 && (c.SidecarLeaseKeys < 1 || c.SidecarLeaseKeys > contract.MaxLeaseKeys) {
		errs = append(errs, fmt.Errorf("--sidecar-lease-keys=%d: want 1-%d (0: the sidecar's default, %d)",
			c.SidecarLeaseKeys, contract.MaxLeaseKeys, contract.DefaultLeaseKeys))
	} else if keys := c.leaseKeys(); c.DefaultMemoryLimit.Sign() > 0 && int64(keys)*contract.LeaseKeyBytes > c.DefaultMemoryLimit.Value()/2 {
		// The other half is the proxy's connections (the sidecar sizes --max-conns from it).
		errs = append(errs, fmt.Errorf("--sidecar-memory-limit=%s: a full lease table of %d keys (--sidecar-lease-keys) takes up to %d MiB at %d bytes a key, more than half the limit: lower --sidecar-lease-keys or raise the limit",
			c.DefaultMemoryLimit.String(), keys, (int64(keys)*contract.LeaseKeyBytes+(1<<20)-1)>>20, contract.LeaseKeyBytes))
	}
	if h := c.SidecarLeaseHorizon; h != nil && (*h < 0 || *h > MaxSidecarLeaseHorizon) {
		errs = append(errs, fmt.Errorf("--sidecar-lease-horizon=%s: want 0 (leases off) to %s", *h, MaxSidecarLeaseHorizon))
	}
	if t := c.SidecarRedisTimeout; t != 0 && (t < MinSidecarRedisTimeout || t > MaxSidecarRedisTimeout) {
		errs = append(errs, fmt.Errorf("--sidecar-redis-timeout=%s: want %s-%s (0: the sidecar's default, %dms)",
			t, MinSidecarRedisTimeout, MaxSidecarRedisTimeout, contract.DefaultRedisTimeoutMillis))
	}
	if c.SidecarTrustedHops < 0 || c.SidecarTrustedHops > contract.MaxTrustedHops {
		errs = append(errs, fmt.Errorf("--sidecar-trusted-hops=%d: want 0-%d proxies (0: the connection's peer address)",
			c.SidecarTrustedHops, contract.MaxTrustedHops))
	}
	return errs
}

// leaseKeys is the lease table bound injected sidecars run with.
func (c *Config) leaseKeys() int {
	if c.SidecarLeaseKeys > 0 {
		return c.SidecarLeaseKeys
	}
	return contract.DefaultLeaseKeys
}

// quantityValue is a flag holding a resource quantity ("100m", "64Mi").
type quantityValue struct{ q *resource.Quantity }

func (v quantityValue) String() string {
	if v.q == nil {
		return ""
	}
	return v.q.String()
}

func (v quantityValue) Set(s string) error {
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want a resource quantity such as 100m or 64Mi: %w", err)
	}
	*v.q = q
	return nil
}

// BackendResolver tells the injector which Redis serves a namespace (backend.Registry: a
// RedisBackend that selects it, or the manager's Redis).
type BackendResolver interface {
	Redis(ctx context.Context, namespace string) (backend.NamespaceRedis, error)
}
