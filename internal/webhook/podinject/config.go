// Package podinject is the mutating admission webhook that injects Redline's sidecar into pods
// that opt in with the redline.dev/inject annotation.
//
// A pod passes through a chain of small mutators (container, volumes, status annotation), in
// the manner of the OpenTelemetry operator's pod webhook. Any problem, from a bad annotation to
// a panic, admits the pod unchanged with an admission warning: the webhook never blocks a pod.
package podinject

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/redline-dev/redline/internal/connbudget"
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

	// Budget is the connection budget the controller publishes in the same manager (not a
	// flag). With it, a pod without redline.dev/redis-pool-size gets the pool the budget gives
	// its workload, and one with it a warning when it overspends; nil leaves pools to the
	// annotation and the sidecar's default.
	Budget *connbudget.Publisher
	// BudgetLookupTimeout bounds the workload lookups of one admission (default 1s); past it,
	// or on any lookup error, the pod gets the default pool.
	BudgetLookupTimeout time.Duration

	// DefaultCPURequest, DefaultMemoryRequest and DefaultMemoryLimit are the sidecar's resources
	// unless the pod's annotations say otherwise.
	DefaultCPURequest, DefaultMemoryRequest, DefaultMemoryLimit resource.Quantity
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
		DefaultCPURequest:    resource.MustParse("50m"),
		DefaultMemoryRequest: resource.MustParse("32Mi"),
		DefaultMemoryLimit:   resource.MustParse("64Mi"),
	}
}

// BindFlags registers the webhook's flags on fs, with c's values as defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.SidecarImage, "sidecar-image", c.SidecarImage, "Image of the injected sidecar. Empty turns pod injection off.")
	fs.StringVar(&c.SidecarImagePullPolicy, "sidecar-image-pull-policy", c.SidecarImagePullPolicy, "Pull policy of the sidecar image (Always, IfNotPresent, Never; empty: the cluster default).")
	fs.StringVar(&c.RedisURL, "sidecar-redis-url", c.RedisURL, "Redis URL given to sidecars (default: the manager's --redis-url).")
	fs.StringVar(&c.RedisSecret, "sidecar-redis-secret", c.RedisSecret, "Secret in each pod's namespace whose key 'password' sidecars use as the Redis password (optional Secret; empty: none).")
	fs.StringVar(&c.NativeSidecars, "native-sidecars", c.NativeSidecars, "Inject the sidecar as a native sidecar (init container with restartPolicy Always): auto (when the API server is 1.29+), true or false.")
	fs.IntVar(&c.Port, "webhook-port", c.Port, "Port of the admission webhook server.")
	fs.StringVar(&c.CertDir, "webhook-cert-dir", c.CertDir, "Directory with the webhook's tls.crt and tls.key.")
	fs.StringVar(&c.CertMode, "webhook-cert-mode", c.CertMode, "Who provides the webhook's certificate: cert-manager (mounted Secret, cainjector) or self-signed (the manager creates and rotates it and patches the caBundle).")
	fs.StringVar(&c.ServiceName, "webhook-service-name", c.ServiceName, "Service in front of the webhook (the certificate's DNS names).")
	fs.StringVar(&c.Namespace, "webhook-namespace", c.Namespace, "Namespace of the webhook Service and of the self-signed certificate Secret (env POD_NAMESPACE when set).")
	fs.StringVar(&c.CertSecret, "webhook-cert-secret", c.CertSecret, "Secret holding the self-signed CA and serving certificate (self-signed mode).")
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
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("--webhook-port=%d: want 1-65535", c.Port))
	}
	return errors.Join(errs...)
}
