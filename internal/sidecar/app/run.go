package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/config"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/sidecar/rls"
)

// Run starts the sidecar and serves until ctx ends, then shuts down gracefully. It returns the
// process exit code: 0 after a clean shutdown, 1 on a failure, 2 on bad flags.
func Run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "redline sidecar:", err) //nolint:errcheck // nothing to do if stderr fails
		return 2
	}
	if cfg.MaxProcs > 0 {
		runtime.GOMAXPROCS(cfg.MaxProcs)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, cfg, log); err != nil {
		log.Error("sidecar stopped", "error", err)
		return 1
	}
	return 0
}

type silentRedisLogger struct{}

func (silentRedisLogger) Printf(context.Context, string, ...any) {}

func run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	// go-redis logs dial failures through its own printf logger; the breaker, the metrics and
	// our structured logs already report an unreachable Redis.
	redis.SetLogger(silentRedisLogger{})
	instance := cfg.PodName
	if instance == "" {
		instance, _ = os.Hostname()
	}
	client, err := limiter.NewClient(cfg.RedisURL, limiter.ClientOptions{
		PoolSize: cfg.RedisPoolSize, ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout,
		Password: cfg.RedisPassword, ClientName: "redline-sidecar",
	})
	if err != nil {
		return fmt.Errorf("creating redis client: %w", err)
	}
	defer client.Close()
	lim, err := limiter.New(client, limiter.Options{})
	if err != nil {
		return fmt.Errorf("creating limiter: %w", err)
	}

	store := &config.Store{}
	m := metrics.New(lim.Stats, store)
	client.AddHook(m.RedisHook())
	beat := make(chan struct{}, 1)
	loader := &config.Loader{
		Dir: cfg.ConfigDir, LabelsFile: cfg.PodLabels, Builder: config.NewBuilder(limiter.FailureMode(cfg.FailureMode)),
		Store: store, Log: log, Resync: cfg.Resync, OnError: func(error) { m.ReloadFailed() },
		OnLoad: func(s *config.Set) {
			m.ConfigLoaded(s)
			if cfg.PodNamespace != "" && s.Namespace != cfg.PodNamespace {
				log.Warn("policies document is for another namespace", "document", s.Namespace, "pod", cfg.PodNamespace)
			}
			select { // announce the new policy set without waiting for the next beat
			case beat <- struct{}{}:
			default:
			}
		},
	}
	if err := loader.Load(); err != nil {
		log.Warn("starting without valid policies: not ready until a valid document appears", "reason", err.Error())
	}
	engine := &decide.Engine{Limiter: lim, TrustedHops: cfg.TrustedHops, Observe: m.Observe}
	ph, err := proxy.New(proxy.Options{
		Upstream: cfg.Upstream, Engine: engine, Store: store, Headers: cfg.RateLimitHeaders,
		ResponseHeaderTimeout: cfg.RequestTimeout, Log: log,
	})
	if err != nil {
		return err
	}

	var draining atomic.Bool
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
	admin.Handle(checkapi.Path, &checkapi.Handler{Engine: engine, Store: store})
	if cfg.Pprof {
		admin.HandleFunc("/debug/pprof/", pprof.Index)
		admin.HandleFunc("/debug/pprof/profile", pprof.Profile)
		admin.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}

	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	proxySrv := &http.Server{
		Handler: ph, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: cfg.MaxHeaderBytes, ErrorLog: errLog,
	}
	adminSrv := &http.Server{
		Handler: admin, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: cfg.MaxHeaderBytes, ErrorLog: errLog,
	}
	proxyLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening for the proxy on %s: %w", cfg.Listen, err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		proxyLn.Close()
		return fmt.Errorf("listening for admin on %s: %w", cfg.AdminListen, err)
	}
	var grpcSrv *rls.HTTPServer
	var grpcLn net.Listener
	if cfg.GRPCListen != "" {
		if grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			proxyLn.Close()
			adminLn.Close()
			return fmt.Errorf("listening for the rate limit service on %s: %w", cfg.GRPCListen, err)
		}
		grpcSrv = rls.NewHTTPServer(&rls.Server{Engine: engine, Store: store})
		grpcSrv.ReadHeaderTimeout, grpcSrv.ErrorLog = cfg.ReadHeaderTimeout, errLog // bounds the wait for the HTTP/2 preface
	}

	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	bgWG.Go(func() {
		if err := loader.Run(bg); err != nil {
			log.Error("policy watcher stopped; the set in force stays", "error", err)
		}
	})
	bgWG.Go(func() { heartbeat(bg, cfg, log, client, store, instance, beat, m) })

	serveErr := make(chan error, 3)
	serve := func(name string, f func() error) {
		go func() {
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("serving %s: %w", name, err)
			}
		}()
	}
	serve("proxy", func() error { return proxySrv.Serve(proxyLn) })
	serve("admin", func() error { return adminSrv.Serve(adminLn) })
	if grpcSrv != nil {
		serve("rate limit service", func() error { return grpcSrv.Serve(grpcLn) })
	}
	log.Info("sidecar serving", "listen", proxyLn.Addr().String(), "upstream", cfg.Upstream,
		"admin", adminLn.Addr().String(), "grpc", cfg.GRPCListen, "instance", instance,
		"failureModeOverride", cfg.FailureMode, "trustedHops", cfg.TrustedHops, "maxProcs", runtime.GOMAXPROCS(0))

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout.String())
	case runErr = <-serveErr:
		log.Error("a listener failed; shutting down", "error", runErr)
	}
	draining.Store(true)
	if cfg.ShutdownDelay > 0 && runErr == nil {
		time.Sleep(cfg.ShutdownDelay)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := proxySrv.Shutdown(sctx); err != nil {
			log.Warn("proxy did not drain in time; closing", "error", err)
			_ = proxySrv.Close()
		}
		ph.Close() // the idle connections to the application
	})
	if grpcSrv != nil {
		wg.Go(func() {
			if err := grpcSrv.Shutdown(sctx); err != nil {
				log.Warn("rate limit service did not drain in time; closing", "error", err)
				_ = grpcSrv.Close()
			}
		})
	}
	wg.Wait()
	// Admin last: health and metrics stay answerable while traffic drains.
	_ = adminSrv.Shutdown(sctx)
	stopBG()
	bgWG.Wait()
	lim.Close()
	log.Info("sidecar stopped")
	return runErr
}

// heartbeat announces this replica in the group of every policy it enforces while Redis is
// reachable, and records each group's live count for LocalFallback.
func heartbeat(ctx context.Context, cfg *Config, log *slog.Logger, client redis.UniversalClient, store *config.Store,
	instance string, now <-chan struct{}, m *metrics.Metrics) {
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	ttl := 3 * cfg.HeartbeatInterval
	failing := false
	for {
		if set := store.Current(); set != nil && len(set.Policies) > 0 {
			hctx, cancel := context.WithTimeout(ctx, cfg.HeartbeatInterval)
			counts, err := limiter.Announce(hctx, client, set.Namespace, instance, set.Hash, ttl, set.PolicyNames())
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				m.HeartbeatFailed()
				if !failing {
					log.Warn("heartbeat failed; LocalFallback keeps the last replica counts", "error", err)
				}
				failing = true
			case err == nil:
				if failing {
					log.Info("heartbeat recorded again")
				}
				failing = false
				for i, p := range set.Policies {
					p.Replicas.Store(counts[i])
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-now:
		}
	}
}
