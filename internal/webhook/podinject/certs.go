package podinject

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// In self-signed mode, cert-controller's rotator keeps CA and serving certificate in one Secret
// shared by all replicas, renews them before they expire and keeps the caBundle of the
// MutatingWebhookConfiguration equal to the CA. The webhook server reads the certificate from
// that Secret mounted at the cert dir, so a renewal reaches every replica through the kubelet.

// ServiceDNSNames are the names the API server may use to reach Service name in namespace.
func ServiceDNSNames(name, namespace string) []string {
	return []string{
		name + "." + namespace + ".svc",
		name + "." + namespace + ".svc.cluster.local",
		name + "." + namespace,
		name,
	}
}

// NewCertRotator returns the rotator for cfg; it closes ready once the serving certificate is
// in cfg.CertDir and the caBundle holds its CA. Add it with rotator.AddRotator.
func NewCertRotator(cfg Config, ready chan struct{}) *rotator.CertRotator {
	names := ServiceDNSNames(cfg.ServiceName, cfg.Namespace)
	return &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: cfg.Namespace, Name: cfg.CertSecret},
		CertDir:        cfg.CertDir,
		CAName:         "redline-webhook-ca",
		CAOrganization: "redline.dev",
		DNSName:        names[0],
		ExtraDNSNames:  names[1:],
		IsReady:        ready,
		Webhooks:       []rotator.WebhookInfo{{Name: cfg.WebhookConfigName, Type: rotator.Mutating}},
		// Every replica serves the webhook, so every replica runs the rotator and waits for its
		// own mount. Their writes are updates at the resourceVersion they read: a replica that
		// loses a race retries, reads the winner's Secret and keeps it.
		RequireLeaderElection: false,
		ControllerName:        "webhook-cert-rotator",
		FieldOwner:            "redline-manager",
	}
}

// createCertSecret creates the certificate Secret, empty, unless it exists: the rotator fills
// a Secret but does not create one (its first read fails, and with it the manager). Empty means
// no keys at all, so that the kubelet mounts no tls.crt before the rotator wrote one.
func createCertSecret(ctx context.Context, c client.Client, cfg Config) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Namespace: cfg.Namespace, Name: cfg.CertSecret,
		Labels: map[string]string{"app.kubernetes.io/name": "redline", "app.kubernetes.io/component": "webhook"},
	}}
	if err := c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating certificate secret %s/%s: %w", cfg.Namespace, cfg.CertSecret, err)
	}
	return nil
}
