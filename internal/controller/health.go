package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// failuresBeforeUnready is how many reconciles of one namespace must fail in a row before the
// manager reports itself unready: one failed status write (a conflict) is routine.
const failuresBeforeUnready = 3

// reconcileHealth tracks namespaces whose reconciles keep failing on the Kubernetes side.
// Redis outages are not counted: sidecars ride them out on their failure mode, and an unready
// manager would also take the pod injection webhook out of its Service.
type reconcileHealth struct {
	mu      sync.Mutex
	failing map[string]failure
}

type failure struct {
	count int
	err   error
}

func (h *reconcileHealth) record(ns string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil || onlyRedis(err) {
		delete(h.failing, ns)
		return
	}
	if h.failing == nil {
		h.failing = map[string]failure{}
	}
	f := h.failing[ns]
	h.failing[ns] = failure{count: f.count + 1, err: err}
}

// onlyRedis reports whether every error joined in err is a Redis one.
func onlyRedis(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyRedis(e) {
				return false
			}
		}
		return true
	}
	var redisErr *redisError
	return errors.As(err, &redisErr)
}

func (h *reconcileHealth) check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var names []string
	for ns, f := range h.failing {
		if f.count >= failuresBeforeUnready {
			names = append(names, ns)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return fmt.Errorf("reconciles of namespace(s) %s keep failing: %w", strings.Join(names, ", "), h.failing[names[0]].err)
}

// ReadyCheck is the manager's readiness: ready once the informer caches have synced and while
// no namespace's reconciles keep failing.
func (r *NamespaceReconciler) ReadyCheck(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced")
		}
		return r.health.check()
	}
}
