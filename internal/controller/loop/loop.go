// Package loop holds what the manager's control loops share, and only that: reading stored
// RateLimitPolicies one by one, the one writer of their status, bounded condition
// messages, coalesced requests, leadership, Redis errors and INFO fields, a ReplicaSet's
// Deployment, and the label of the objects Redline manages. It imports no loop.
package loop

import (
	"errors"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The label on the objects the controllers own (the namespaces' ConfigMap and credentials
// Secret): what carries another value, or none, is a tenant's and is never overwritten.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "redline"
)

// Message keeps condition messages within the API's 32768 bytes with room to spare.
func Message(s string) string {
	const max = 1024
	if len(s) <= max {
		return s
	}
	return s[:max-3] + "..."
}

// IsElected says whether the replica of elected (ctrl.Manager.Elected) leads; nil: it always does.
func IsElected(elected <-chan struct{}) bool {
	if elected == nil {
		return true
	}
	select {
	case <-elected:
		return true
	default:
		return false
	}
}

// DurationOr is d, or def when d is not positive.
func DurationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// redisError marks a reconcile error as Redis's.
type redisError struct{ err error }

func (e *redisError) Error() string { return "loading scripts into redis: " + e.err.Error() }
func (e *redisError) Unwrap() error { return e.err }

// WrapRedis marks err, a Redis call's, as Redis's (nil stays nil).
func WrapRedis(err error) error {
	if err == nil {
		return nil
	}
	return &redisError{err}
}

// InfoField is the integer field of a Redis INFO reply.
func InfoField(info, field string) (int64, error) {
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == field {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("field " + field + " missing from INFO")
}

// OwnedByDeployment says whether obj (a ReplicaSet) is a Deployment's: the budget and the
// bypass check count the Deployment, not its ReplicaSets.
func OwnedByDeployment(obj metav1.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.Kind == "Deployment" && strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/")
}
