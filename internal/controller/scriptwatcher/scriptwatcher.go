package scriptwatcher

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/backend"
)

// Watcher re-checks the scripts in Redis on a period, so that a Redis restart, a failover
// or a SCRIPT FLUSH is repaired and reflected in the policies' Programmed condition without
// waiting for a policy to change. On every change of health it asks for a reconcile of every
// namespace with policies.
type Watcher struct {
	// Backends are checked at once, every one of them.
	Backends *backend.Registry
	Interval time.Duration
	Log      logr.Logger
	// Events receives one GenericEvent when the scripts' health changes; the reconciler
	// turns it into a reconcile of every namespace.
	Events chan<- event.GenericEvent

	mu      sync.Mutex
	healthy *string
}

// Start runs until ctx ends. It implements manager.Runnable.
func (w *Watcher) Start(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.check(ctx)
		}
	}
}

func (w *Watcher) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, w.Interval)
	defer cancel()
	// Ensure reloads a script that a restart, failover or SCRIPT FLUSH removed, here and now.
	// A sidecar on a shared credential loads it on NOSCRIPT itself; one on its namespace's ACL
	// user may not (SCRIPT LOAD and EVAL would let a tenant run any Lua), so this check is what
	// heals it, within one Interval.
	healthy := w.ensure(cctx)
	w.mu.Lock()
	changed := w.healthy == nil || *w.healthy != healthy
	w.healthy = &healthy
	w.mu.Unlock()
	if changed {
		select {
		case w.Events <- event.GenericEvent{}:
		case <-ctx.Done():
		}
	}
}

// ensure loads what is missing on every backend and returns which ones are healthy, as a
// string that changes when any backend's health does (or a backend comes or goes).
func (w *Watcher) ensure(ctx context.Context) string {
	var mu sync.Mutex
	health := map[string]bool{}
	_ = w.Backends.Each(ctx, func(ctx context.Context, be *backend.Backend) error {
		_, err := be.Scripts.Ensure(ctx)
		if err != nil {
			w.Log.V(1).Info("redis scripts unavailable", "backend", be.Label(), "error", err.Error())
		}
		mu.Lock()
		health[be.ID()] = err == nil
		mu.Unlock()
		return nil
	})
	var b strings.Builder
	for _, id := range backend.SortedKeys(health) {
		b.WriteString(id + "=" + strconv.FormatBool(health[id]) + ";")
	}
	return b.String()
}
