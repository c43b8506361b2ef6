package podinject

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the self-signed certificate Secret (type kubernetes.io/tls, plus the CA's key).
const (
	secretCAKey = "ca.key"
	secretCACrt = "ca.crt"
)

// CertRotator keeps the webhook's self-signed certificate: it stores CA and serving certificate
// in one Secret, so that every manager replica serves a certificate of the same CA, writes them
// to the webhook server's cert dir (whose file watcher picks them up) and keeps the caBundle of
// the MutatingWebhookConfiguration equal to the CA.
//
// Every replica runs it: it needs no leader, and all its writes are conditional (create, or
// update at a resourceVersion), so replicas that race agree on one Secret.
type CertRotator struct {
	// Client must read from the API server directly: it runs before the manager's cache starts,
	// and a cache of Secrets would watch all of them.
	Client client.Client
	// Config gives the Secret, Service, webhook configuration and cert dir.
	Config Config
	// Interval between checks; renewal happens well before expiry, so hours are fine.
	Interval time.Duration
	// Log receives state changes and failures.
	Log logr.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica serves the
// webhook and so needs the files.
func (r *CertRotator) NeedLeaderElection() bool { return false }

// Start checks the certificate every Interval until ctx ends, sooner after a failure.
func (r *CertRotator) Start(ctx context.Context) error {
	for {
		wait := r.Interval
		if err := r.Ensure(ctx); err != nil {
			r.Log.Error(err, "keeping the webhook certificate")
			wait = min(wait, time.Minute)
		}
		// Jitter spreads the replicas' checks.
		wait += time.Duration(rand.Int64N(int64(wait/10) + 1))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Ensure makes the Secret hold a valid bundle, writes it to the cert dir and patches the
// caBundle.
func (r *CertRotator) Ensure(ctx context.Context) error {
	b, err := r.ensureSecret(ctx)
	if err != nil {
		return err
	}
	if err := r.writeFiles(b); err != nil {
		return err
	}
	return r.patchCABundle(ctx, b.CACert)
}

func (r *CertRotator) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *CertRotator) dnsNames() []string {
	return ServiceDNSNames(r.Config.ServiceName, r.Config.Namespace)
}

// ensureSecret returns the bundle in the Secret, creating or renewing it when needed.
func (r *CertRotator) ensureSecret(ctx context.Context) (*CertBundle, error) {
	key := client.ObjectKey{Namespace: r.Config.Namespace, Name: r.Config.CertSecret}
	// A lost race (another replica created or renewed the Secret first) is answered by reading
	// what the winner wrote.
	for range 5 {
		secret := &corev1.Secret{}
		err := r.Client.Get(ctx, key, secret)
		if apierrors.IsNotFound(err) {
			b, err := GenerateBundle(r.dnsNames(), r.now())
			if err != nil {
				return nil, err
			}
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
					Labels: map[string]string{"app.kubernetes.io/name": "redline", "app.kubernetes.io/component": "webhook"}},
				Type: corev1.SecretTypeTLS,
			}
			toSecret(b, secret)
			if err := r.Client.Create(ctx, secret); apierrors.IsAlreadyExists(err) {
				continue
			} else if err != nil {
				return nil, fmt.Errorf("creating certificate secret %s: %w", key, err)
			}
			r.Log.Info("created self-signed webhook certificate", "secret", key.String())
			return b, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading certificate secret %s: %w", key, err)
		}

		b := fromSecret(secret)
		renewCA, renewServing := checkBundle(b, r.dnsNames(), r.now())
		if !renewServing {
			return b, nil
		}
		if renewCA {
			// The caBundle changes with the CA: replicas still serving the old certificate fail
			// calls until their next check, which failurePolicy Ignore turns into uninjected pods,
			// not refused ones.
			b, err = GenerateBundle(r.dnsNames(), r.now())
		} else {
			b.TLSCert, b.TLSKey, err = GenerateServing(b.CACert, b.CAKey, r.dnsNames(), r.now())
		}
		if err != nil {
			return nil, err
		}
		toSecret(b, secret)
		if err := r.Client.Update(ctx, secret); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("renewing certificate secret %s: %w", key, err)
		}
		r.Log.Info("renewed self-signed webhook certificate", "secret", key.String(), "newCA", renewCA)
		return b, nil
	}
	return nil, fmt.Errorf("certificate secret %s: kept changing under concurrent writers", key)
}

func toSecret(b *CertBundle, s *corev1.Secret) {
	s.Data = map[string][]byte{
		corev1.TLSCertKey:       b.TLSCert,
		corev1.TLSPrivateKeyKey: b.TLSKey,
		secretCACrt:             b.CACert,
		secretCAKey:             b.CAKey,
	}
}

func fromSecret(s *corev1.Secret) *CertBundle {
	return &CertBundle{
		CACert: s.Data[secretCACrt], CAKey: s.Data[secretCAKey],
		TLSCert: s.Data[corev1.TLSCertKey], TLSKey: s.Data[corev1.TLSPrivateKeyKey],
	}
}

// writeFiles puts the serving certificate into the cert dir, each file replaced by a rename so
// the server never reads half a file.
func (r *CertRotator) writeFiles(b *CertBundle) error {
	dir := r.Config.CertDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating cert dir %s: %w", dir, err)
	}
	files := []struct {
		name string
		data []byte
	}{{corev1.TLSPrivateKeyKey, b.TLSKey}, {corev1.TLSCertKey, b.TLSCert}, {secretCACrt, b.CACert}}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if old, err := os.ReadFile(path); err == nil && equalPEM(old, f.data) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("replacing %s: %w", path, err)
		}
	}
	return nil
}

// patchCABundle sets caBundle on every webhook of the configuration.
func (r *CertRotator) patchCABundle(ctx context.Context, ca []byte) error {
	key := client.ObjectKey{Name: r.Config.WebhookConfigName}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := r.Client.Get(ctx, key, mwc); err != nil {
			return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", key.Name, err)
		}
		changed := false
		for i := range mwc.Webhooks {
			if !equalPEM(mwc.Webhooks[i].ClientConfig.CABundle, ca) {
				mwc.Webhooks[i].ClientConfig.CABundle = ca
				changed = true
			}
		}
		if !changed {
			return nil
		}
		if err := r.Client.Update(ctx, mwc); err != nil {
			return fmt.Errorf("patching caBundle of MutatingWebhookConfiguration %s: %w", key.Name, err)
		}
		r.Log.Info("patched webhook caBundle", "webhookConfiguration", key.Name)
		return nil
	})
}
