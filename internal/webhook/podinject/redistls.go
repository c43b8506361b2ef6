package podinject

import (
	"errors"
	"flag"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// SidecarTLS is how injected sidecars reach a rediss:// Redis beyond the system's CAs.
//
// A sidecar needs the CA that signed Redis's certificate (public) and, where Redis requires
// client certificates, a certificate and key of its own (secret, and best one per namespace:
// a certificate the manager copied into every namespace would be every tenant's). Both come
// from a Secret of the pod's own namespace, named the same in every namespace, with the keys
// of a kubernetes.io/tls Secret and its CA (contract.RedisTLSCAKey, RedisTLSCertKey,
// RedisTLSKeyKey): what cert-manager writes for a Certificate in that namespace. It is mounted
// read-only (contract.RedisTLSVolume), optional: whether a namespace's Redis uses TLS is in its
// ConfigMap (RedisConfigMapName), not in the pod's patch, and a namespace whose Redis has no
// TLS has no such Secret; a sidecar whose Redis uses TLS and finds no CA file there exits
// saying so. The flags (server name, minimum version, the files) are the cluster Redis's,
// the same in every pod; a namespace's own Redis replaces them all from its ConfigMap.
type SidecarTLS struct {
	// Secret names the Secret in each injected pod's namespace; empty mounts nothing (the
	// system's CAs, no client certificate).
	Secret string
	// ClientCertificate mounts the Secret's certificate and key too and has the sidecar
	// present them.
	ClientCertificate bool
	// ServerName and MinVersion are redisconn.TLSOptions' (empty: the sidecar's defaults).
	ServerName, MinVersion string
}

// bindFlags registers the --sidecar-redis-tls-* flags.
func (t *SidecarTLS) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&t.Secret, "sidecar-redis-tls-secret", t.Secret, "With a rediss:// sidecar URL: Secret in each injected pod's namespace whose key "+contract.RedisTLSCAKey+
		" is the CA sidecars verify Redis with (and "+contract.RedisTLSCertKey+", "+contract.RedisTLSKeyKey+" with --sidecar-redis-tls-client-cert), mounted read-only at "+contract.RedisTLSDir+
		"; optional (a namespace whose own Redis has no TLS has none): the sidecar of a namespace without it, whose Redis uses TLS, exits saying so. Empty: the system's CAs.")
	fs.BoolVar(&t.ClientCertificate, "sidecar-redis-tls-client-cert", t.ClientCertificate, "Sidecars present the client certificate of --sidecar-redis-tls-secret (keys "+contract.RedisTLSCertKey+", "+contract.RedisTLSKeyKey+"), for a Redis that requires one.")
	fs.StringVar(&t.ServerName, "sidecar-redis-tls-server-name", t.ServerName, "The name sidecars verify in Redis's certificates (default: --redis-tls-server-name when --sidecar-redis-url is not set; empty: the host each connection dials).")
	fs.StringVar(&t.MinVersion, "sidecar-redis-tls-min-version", t.MinVersion, "Oldest TLS version sidecars accept, 1.2 or 1.3 (default: --redis-tls-min-version when --sidecar-redis-url is not set; empty: 1.2).")
}

// DefaultFrom takes the manager's server name and minimum version where t has none: for
// sidecars that use the manager's own Redis.
func (t *SidecarTLS) DefaultFrom(manager redisconn.TLSOptions) {
	if t.ServerName == "" {
		t.ServerName = manager.ServerName
	}
	if t.MinVersion == "" {
		t.MinVersion = manager.MinVersion
	}
}

// options are the sidecar's TLS options, as the flags of sidecarArgs give them.
func (t SidecarTLS) options() redisconn.TLSOptions {
	o := redisconn.TLSOptions{ServerName: t.ServerName, MinVersion: t.MinVersion}
	if t.Secret != "" {
		o.CAFile = path.Join(contract.RedisTLSDir, contract.RedisTLSCAKey)
	}
	if t.ClientCertificate {
		o.CertFile = path.Join(contract.RedisTLSDir, contract.RedisTLSCertKey)
		o.KeyFile = path.Join(contract.RedisTLSDir, contract.RedisTLSKeyKey)
	}
	return o
}

// validate checks t against the sidecars' Redis URL (empty: not known yet).
func (t SidecarTLS) validate(redisURL string) []error {
	var errs []error
	if t.Secret != "" {
		for _, msg := range validation.IsDNS1123Subdomain(t.Secret) {
			errs = append(errs, fmt.Errorf("--sidecar-redis-tls-secret=%q: %s", t.Secret, msg))
		}
	}
	if t.ClientCertificate && t.Secret == "" {
		errs = append(errs, errors.New("--sidecar-redis-tls-client-cert needs --sidecar-redis-tls-secret, the Secret holding each namespace's certificate and key"))
	}
	if err := t.options().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--sidecar-redis-tls-*: %w", err))
	}
	if redisURL != "" && !redisconn.URLUsesTLS(redisURL) && !t.options().IsZero() {
		errs = append(errs, fmt.Errorf("the --sidecar-redis-tls-* flags need a rediss:// or rediss+sentinel:// Redis URL for sidecars, got %s", redisconn.RedactURL(redisURL)))
	}
	return errs
}

// args are the sidecar's TLS flags.
func (t SidecarTLS) args() []string {
	o := t.options()
	var args []string
	for _, f := range []struct{ flag, value string }{
		{contract.FlagRedisTLSCAFile, o.CAFile},
		{contract.FlagRedisTLSCertFile, o.CertFile},
		{contract.FlagRedisTLSKeyFile, o.KeyFile},
		{contract.FlagRedisTLSServerName, o.ServerName},
		{contract.FlagRedisTLSMinVersion, o.MinVersion},
	} {
		if f.value != "" {
			args = append(args, fmt.Sprintf("--%s=%s", f.flag, f.value))
		}
	}
	return args
}

// volumeMount is the sidecar's mount of the TLS Secret; ok is false when there is none.
func (t SidecarTLS) volumeMount() (m corev1.VolumeMount, ok bool) {
	if t.Secret == "" {
		return m, false
	}
	return corev1.VolumeMount{Name: contract.RedisTLSVolume, MountPath: contract.RedisTLSDir, ReadOnly: true}, true
}

// volume is the TLS Secret's volume; ok is false when there is none.
func (t SidecarTLS) volume() (v corev1.Volume, ok bool) {
	if t.Secret == "" {
		return v, false
	}
	items := []corev1.KeyToPath{{Key: contract.RedisTLSCAKey, Path: contract.RedisTLSCAKey}}
	if t.ClientCertificate {
		items = append(items,
			corev1.KeyToPath{Key: contract.RedisTLSCertKey, Path: contract.RedisTLSCertKey},
			corev1.KeyToPath{Key: contract.RedisTLSKeyKey, Path: contract.RedisTLSKeyKey})
	}
	return corev1.Volume{Name: contract.RedisTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		// Optional (see SidecarTLS): a namespace whose Redis has no TLS has no such Secret,
		// and a sidecar whose Redis has TLS and finds no CA file exits saying so. Listed keys
		// only: nothing else of the Secret reaches the pod.
		SecretName: t.Secret, Optional: new(true), Items: items,
		// Readable by the sidecar's non-root user whatever the pod's fsGroup, as the
		// credentials are: the pod's other containers could mount the Secret of their own
		// namespace anyway.
		DefaultMode: ptr.To[int32](0o444),
	}}}, true
}
