package tenantacl

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// deriveSentinelPassword is the password of the shared sentinel reader (redisacl.
// SentinelReaderUser), derived from the same key as the namespaces' passwords.
//
// It is not rotated: the user can read only the group's topology, which every tenant may know
// and which reaches no data, so a password a former tenant kept gains it nothing worth a
// rotation; and sidecars read it at each new sentinel connection (redisconn.SentinelCredentials),
// so replacing the key Secret changes it without restarting a pod.
func deriveSentinelPassword(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("redline sentinel reader\x00"))
	return hex.EncodeToString(m.Sum(nil))
}

// sentinelIsolation is the TenantIsolation verdict for the sentinels, from why they are
// unprotected ("" when they are not): false with v1alpha1.ReasonSentinelUnprotected and what a tenant
// can then do, or true.
func sentinelIsolation(why string) (isolated bool, reason, message string) {
	if why == "" {
		return true, "", ""
	}
	return false, v1alpha1.ReasonSentinelUnprotected, "The Redis Sentinels are unprotected (" + why + "): anything that reaches them, " +
		"this namespace's pods included, can SENTINEL REMOVE and MONITOR the group at a server of its own, so that every " +
		"sidecar and the manager send their Redis users and passwords there, or SENTINEL FAILOVER at will. Give the " +
		"sentinels a password (requirepass or ACL users, Redis 6.2+) and the manager its admin credential (--redis-sentinel-password-file)"
}

// ensureSentinels, with Sentinel, sets the shared reader on every sentinel and returns its
// password, or why the sentinels are unprotected; without Sentinel it returns nothing.
func (r *Reconciler) ensureSentinels(ctx context.Context, t redisTarget, key []byte) (password, unprotected string, err error) {
	if t.sentinels == nil {
		return "", "", nil
	}
	// Two passes, since the clients of the sentinels live for one call of fn: is any of them
	// open, then set the reader on each.
	var (
		mu  sync.Mutex
		why string
	)
	err = t.sentinels(ctx, func(ctx context.Context, c *redis.Client) error {
		w, err := redisacl.SentinelUnprotected(ctx, []redisacl.Node{c})
		if err != nil {
			return err
		}
		mu.Lock()
		if w != "" && why == "" {
			why = w
		}
		mu.Unlock()
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("checking the sentinels: %w", err)
	}
	if why != "" {
		return "", why, nil
	}
	password = deriveSentinelPassword(key)
	// Every namespace's reconcile comes here, and each set writes every sentinel's config to
	// disk: once per check interval is enough for one shared user (a sentinel that restarts
	// keeps it in its config).
	r.sentinelMu.Lock()
	defer r.sentinelMu.Unlock()
	if last, ok := r.sentinelSet[t.id]; ok && last.pw == password && r.now().Sub(last.at) < r.checkInterval() {
		return password, "", nil
	}
	if err := t.sentinels(ctx, func(ctx context.Context, c *redis.Client) error {
		return redisacl.EnsureSentinelReader(ctx, []redisacl.Node{c}, password)
	}); err != nil {
		if errors.Is(err, redisacl.ErrUnavailable) {
			return "", "a sentinel refused ACL SETUSER (" + err.Error() + ")", nil
		}
		return "", "", fmt.Errorf("setting the sentinel reader: %w", err)
	}
	if r.sentinelSet == nil {
		r.sentinelSet = map[string]sentinelSet{}
	}
	r.sentinelSet[t.id] = sentinelSet{at: r.now(), pw: password}
	return password, "", nil
}

// ProbeSentinels says whether the sentinels can be locked down (for --redis-tenant-acl=
// required): an error naming Sentinel when one refuses ACL commands or lets anyone in.
func ProbeSentinels(ctx context.Context, sentinels func(ctx context.Context, fn func(context.Context, *redis.Client) error) error) error {
	return sentinels(ctx, func(ctx context.Context, c *redis.Client) error {
		why, err := redisacl.SentinelUnprotected(ctx, []redisacl.Node{c})
		if err != nil {
			return err
		}
		if why != "" {
			return fmt.Errorf("%s: %s, so a tenant could point the group at a server of its own", v1alpha1.ReasonSentinelUnprotected, why)
		}
		return nil
	})
}

// sentinelSecretData adds the sentinel reader's credentials to a namespace's Secret data.
func sentinelSecretData(data map[string][]byte, password string) {
	if password == "" {
		return
	}
	data[contract.RedisSentinelUsernameKey] = []byte(redisacl.SentinelReaderUser)
	data[contract.RedisSentinelSecretKey] = []byte(password)
}

// sentinelSet is when the sentinel reader was last set on one backend's sentinels.
type sentinelSet struct {
	at time.Time
	pw string
}

// plaintextSentinel says, on a namespace served through Sentinel without TLS, what an attacker
// with network reach can do.
const plaintextSentinel = "The sentinels and Redis are reached without TLS: anything on the network path between them and a pod or the manager " +
	"can read and change the traffic, these credentials and the manager's included, and answer in a server's place; without such a position, " +
	"no client is sent to a server the sentinels did not promote (use rediss+sentinel:// to close this)"
