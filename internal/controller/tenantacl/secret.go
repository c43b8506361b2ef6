package tenantacl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// secretDigestAnnotation carries, in the Secrets cache only, the SHA-256 of a Secret's data:
// the cache keeps it instead of the data, which a tenant can make up to a MiB.
const secretDigestAnnotation = "redline.dev/data-sha256"

// desiredSecretData is what the namespace's Secret holds: its user, and with Sentinel the
// shared sentinel reader (sentinelPassword, "" without).
func desiredSecretData(ns, password, sentinelPassword string) map[string][]byte {
	data := map[string][]byte{
		contract.RedisUsernameKey: []byte(redisacl.Username(ns)),
		contract.RedisSecretKey:   []byte(password),
	}
	sentinelSecretData(data, sentinelPassword)
	return data
}

// writeSecret makes the namespace's Secret hold its user's current credentials. What a tenant
// did to it (edited, deleted, emptied, made immutable) is undone.
func (r *Reconciler) writeSecret(ctx context.Context, ns, password, sentinelPassword string) error {
	data := desiredSecretData(ns, password, sentinelPassword)
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: r.SecretName, Namespace: ns,
			Labels: map[string]string{loop.ManagedByLabel: loop.ManagedByValue},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	var cur corev1.Secret
	err := r.secretReader().Get(ctx, client.ObjectKey{Namespace: ns, Name: r.SecretName}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		// AlreadyExists: the cache has not seen it yet; its watch event brings us back.
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating secret %s/%s: %w", ns, r.SecretName, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading secret %s/%s: %w", ns, r.SecretName, err)
	}
	if secretDigest(&cur) == dataDigest(data) && cur.Labels[loop.ManagedByLabel] == loop.ManagedByValue &&
		cur.Type == corev1.SecretTypeOpaque && (cur.Immutable == nil || !*cur.Immutable) {
		return nil
	}
	want.ResourceVersion = cur.ResourceVersion
	err = r.Client.Update(ctx, want)
	if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		// Immutable, or of another type: replace it.
		if err := r.Client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replacing secret %s/%s: %w", ns, r.SecretName, err)
		}
		want.ResourceVersion = ""
		err = r.Client.Create(ctx, want)
	}
	if err != nil {
		return fmt.Errorf("writing secret %s/%s: %w", ns, r.SecretName, err)
	}
	return nil
}

// secretDigest is the digest of a Secret's data: the one the Secrets cache left in place of
// the data, or computed when read directly.
func secretDigest(s *corev1.Secret) string {
	if d, ok := s.Annotations[secretDigestAnnotation]; ok && s.Data == nil {
		return d
	}
	return dataDigest(s.Data)
}

func dataDigest(data map[string][]byte) string {
	h := sha256.New()
	for _, k := range []string{contract.RedisUsernameKey, contract.RedisSecretKey, contract.RedisSentinelUsernameKey, contract.RedisSentinelSecretKey} {
		v, ok := data[k]
		h.Write([]byte(k + "=" + strconv.FormatBool(ok) + ":" + strconv.Itoa(len(v)) + ":"))
		h.Write(v)
	}
	// Any other key makes it differ too: the Secret holds exactly these.
	h.Write([]byte(strconv.Itoa(len(data))))
	return hex.EncodeToString(h.Sum(nil))
}

// slimSecret is the Secrets cache's transform: a Secret is kept as its name, labels, type,
// immutability, version and data digest, not its data, annotations or managed fields.
func slimSecret(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	out := &corev1.Secret{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			Annotations: map[string]string{secretDigestAnnotation: dataDigest(s.Data)},
		},
		Type: s.Type, Immutable: s.Immutable,
	}
	if v, ok := s.Labels[loop.ManagedByLabel]; ok {
		out.Labels = map[string]string{loop.ManagedByLabel: v}
	}
	return out, nil
}

func (r *Reconciler) secretReader() client.Reader {
	if r.secrets != nil {
		return r.secrets
	}
	return r.Client
}
