package app

import (
	"fmt"
	"io"
	stdlog "log"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// adminMux serves health, readiness (false while draining) and metrics, and the profiler when
// asked for.
func adminMux(cfg *Config, store *ruleset.Store, m *metrics.Metrics, draining *atomic.Bool) *http.ServeMux {
	admin := http.NewServeMux()
	admin.HandleFunc("GET "+contract.HealthzPath, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	admin.HandleFunc("GET "+contract.ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		ready, why := store.Ready()
		if draining.Load() {
			ready, why = false, "shutting down"
		}
		if !ready {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintf(w, "ok: policies %s\n", store.Current().Hash)
	})
	admin.Handle("GET "+contract.MetricsPath, m.Handler())
	if cfg.Pprof {
		admin.HandleFunc("/debug/pprof/", pprof.Index)
		admin.HandleFunc("/debug/pprof/profile", pprof.Profile)
		admin.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return admin
}

// Admin face bounds. Its clients are the kubelet (a new connection per probe, a 1 s probe
// timeout) and Prometheus (one keep-alive connection, a scrape every 15-60 s): nothing it
// serves needs long headers, a slow body or a long idle connection, and a client that dribbles
// or idles is cut in seconds.
const (
	adminReadTimeout    = 5 * time.Second
	adminIdleTimeout    = 5 * time.Second
	adminMaxHeaderBytes = 16 << 10
)

// newAdminServer serves health, readiness and metrics with the admin face's short timeouts.
// No WriteTimeout: /debug/pprof/profile, when turned on, answers after 30 s.
func newAdminServer(h http.Handler, errLog *stdlog.Logger) *http.Server {
	return &http.Server{
		Handler: h, ReadHeaderTimeout: adminReadTimeout, ReadTimeout: adminReadTimeout,
		IdleTimeout: adminIdleTimeout, MaxHeaderBytes: adminMaxHeaderBytes, ErrorLog: errLog,
	}
}
