package tenantacl

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/internal/controller/loop"
)

// derivePassword is namespace's password of rotation period n.
func derivePassword(key []byte, namespace string, n int64) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("redline redis acl\x00" + namespace + "\x00" + strconv.FormatInt(n, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// passwordKey reads the key passwords are derived from, creating it on first use. Replicas
// racing to create it agree: the loser reads the winner's.
func (r *Reconciler) passwordKey(ctx context.Context) ([]byte, error) {
	r.keyMu.Lock()
	defer r.keyMu.Unlock()
	if r.key != nil {
		return r.key, nil
	}
	for range 2 {
		var s corev1.Secret
		err := r.APIReader.Get(ctx, r.KeySecret, &s)
		if err == nil {
			k := s.Data["key"]
			if len(k) < 32 {
				return nil, fmt.Errorf("secret %s: key %q holds %d bytes, want at least 32", r.KeySecret, "key", len(k))
			}
			r.key = k
			return k, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading secret %s: %w", r.KeySecret, err)
		}
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("making the redis password key: %w", err)
		}
		err = r.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: r.KeySecret.Name, Namespace: r.KeySecret.Namespace,
				Labels: map[string]string{loop.ManagedByLabel: loop.ManagedByValue},
			},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": k},
		})
		if err == nil {
			r.key = k
			return k, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating secret %s: %w", r.KeySecret, err)
		}
	}
	return nil, fmt.Errorf("secret %s: created and gone again", r.KeySecret)
}
