package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/connlimit"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
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
	// What the standard library logs on its own (net/http's transport on an unsolicited
	// response, say) comes out as the same JSON.
	slog.SetDefault(log)
	setMemoryLimit(cfg, getenv, log)
	if err := run(ctx, cfg, log); err != nil {
		log.Error("sidecar stopped", "error", err)
		return 1
	}
	return 0
}

// setMemoryLimit makes the garbage collector work harder as the heap nears the container's
// limit, instead of letting a burst of garbage on top of a full live heap cross it and the
// kernel kill the sidecar (and with it, for a native sidecar, the pod's traffic). The connection
// bounds keep the live heap under it; this keeps garbage from adding to it. A GOMEMLIMIT set
// by the pod's author wins: the runtime has applied it already.
func setMemoryLimit(cfg *Config, getenv func(string) string, log *slog.Logger) {
	if getenv("GOMEMLIMIT") != "" || cfg.MemoryLimit <= 0 {
		return
	}
	limit := cfg.MemoryLimit / 100 * contract.MemoryLimitPercent
	debug.SetMemoryLimit(limit)
	log.Info("Go memory limit set from the container's", "containerLimitBytes", cfg.MemoryLimit, "goMemoryLimitBytes", limit)
}

// memoryBudget is the budget of what clients make the sidecar hold: --memory-budget, or a
// share of Go's memory limit as setMemoryLimit (or GOMEMLIMIT) left it.
func memoryBudget(cfg *Config, log *slog.Logger) *membudget.Budget {
	size := cfg.MemoryBudget
	if size == 0 {
		size = membudget.SizeFor(debug.SetMemoryLimit(-1), membudget.DefaultPercent)
	}
	b := membudget.New(size)
	log.Info("memory budget for requests", "bytes", b.Stats().Size)
	return b
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
	// Connections open lazily and idle ones close: nothing at start needs Redis (readiness
	// is the policies file; the heartbeat and the scripts dial when they first run).
	conns := &redisconn.ConnStats{}
	var creds, sentinelCreds func(context.Context) (string, string, error)
	if cfg.RedisCredsDir != "" {
		creds = redisconn.FileCredentials(cfg.RedisCredsDir, contract.RedisUsernameKey, contract.RedisSecretKey, cfg.RedisPassword)
		// With Sentinel: the read-only sentinel user the controller writes beside the
		// namespace's own, read at every new sentinel connection like it.
		sentinelCreds = redisconn.FileCredentials(cfg.RedisCredsDir, contract.RedisSentinelUsernameKey, contract.RedisSentinelSecretKey, "")
	}
	client, err := redisconn.NewClient(cfg.RedisURL, redisconn.Options{
		PoolSize: cfg.RedisPoolSize, MaxIdleConns: cfg.RedisMaxIdle, ConnMaxIdleTime: cfg.RedisIdleTimeout,
		// Waiting for a free connection is part of a decision's wait for Redis.
		ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout, PoolTimeout: cfg.RedisTimeout,
		Password: cfg.RedisPassword, Credentials: creds, SentinelCredentials: sentinelCreds, ClientName: contract.RedisClientName, Stats: conns,
		// A rotated TLS Secret that does not parse: the last good files stay in use.
		TLS: cfg.RedisTLS, TLSFileError: func(err error) { log.Error("redis TLS files changed but cannot be used", "err", err) },
	})
	if err != nil {
		return fmt.Errorf("creating redis client: %w", err)
	}
	defer client.Close()
	store := &ruleset.Store{}
	beat := make(chan struct{}, 1)                 // a heartbeat now, not at the next tick
	var restoredTo atomic.Pointer[metrics.Metrics] // set once the metrics exist, before any decision
	lim, err := newLimiter(client, cfg, store, beat, &restoredTo)
	if err != nil {
		return err
	}

	m := metrics.New(lim.Stats, store)
	restoredTo.Store(m)
	builder := ruleset.NewBuilder(limiter.FailureMode(cfg.FailureMode))
	builder.Namespace = cfg.PodNamespace
	client.AddHook(m.RedisHook())
	m.WatchPool(client, conns, cfg.RedisPoolSize)
	m.WatchSlots(lim.SlotStats)
	// healthSrv is the gRPC health service, set before the watcher starts reloading.
	var healthSrv *health.Server
	loader := &ruleset.Loader{
		Dir: cfg.ConfigDir, LabelsFile: cfg.PodLabels, Builder: builder,
		Store: store, Log: log, Resync: cfg.Resync, OnError: func(error) { m.ReloadFailed() },
		OnLoad: func(s *ruleset.Set) {
			m.ConfigLoaded(s)
			if hs := healthSrv; hs != nil {
				rls.SetServing(hs)
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
	decisionLog, err := decide.NewDecisionLog(log, cfg.DecisionLog, cfg.DecisionLogSample, cfg.DecisionLogRate)
	if err != nil {
		return err
	}
	m.WatchDecisionLog(func() int64 {
		if decisionLog == nil {
			return 0
		}
		return decisionLog.Dropped()
	})
	engine := &decide.Engine{Limiter: lim, TrustedHops: cfg.TrustedHops, Observe: m.Observe, ObserveSettle: m.Settled, ObserveSlot: m.ObserveSlot, OnSlots: m.SlotsHeld, Log: decisionLog}
	memory := memoryBudget(cfg, log)
	m.WatchMemory(memory.Stats)
	ph, err := proxy.New(proxy.Options{
		Upstream: cfg.Upstream, UpstreamProtocol: cfg.UpstreamProtocol, MaxStreams: cfg.MaxConns, Engine: engine, Store: store, Headers: cfg.RateLimitHeaders,
		ResponseHeaderTimeout: cfg.RequestTimeout, Memory: memory, OnUnsized: m.UnsizedRefused, Log: log,
	})
	if err != nil {
		return err
	}

	var draining atomic.Bool
	admin := adminMux(cfg, store, m, &draining)

	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
			MaxHeaderBytes: cfg.MaxHeaderBytes, ErrorLog: errLog,
		}
	}
	// On every HTTP face, idle keep-alive connections make room for new ones at the face's
	// bound (connlimit.IdleCloser).
	var proxyIdle, adminIdle, checkIdle connlimit.IdleCloser
	proxySrv := newServer(ph)
	proxy.ServeProtocols(proxySrv) // h2c beside HTTP/1.1
	proxySrv.ConnState = proxyIdle.ConnState
	adminSrv := newAdminServer(admin, errLog)
	adminSrv.ConnState = adminIdle.ConnState
	var checkSrv *http.Server
	// The slots the decision faces keep for their clients: released when a client neither
	// renews nor releases them within their lease (a check client renews; Envoy cannot).
	var slotRegs []*decide.SlotRegistry
	if cfg.CheckListen != "" {
		checkSlots := &decide.SlotRegistry{Memory: memory, Lease: cfg.InFlightExpiry}
		checkSlots.Expired = m.WatchSlotRegistry(metrics.FaceCheck, checkSlots)
		slotRegs = append(slotRegs, checkSlots)
		check := http.NewServeMux()
		check.Handle(checkapi.Path, &checkapi.Handler{Engine: engine, Store: store, Holds: &decide.Registry{Memory: memory, Refused: m.RegistryRefused(metrics.FaceCheck)}, OnUnsized: m.UnsizedRefused, Slots: checkSlots})
		check.Handle(checkapi.TopKeysPath, &checkapi.TopKeysHandler{Store: store})
		checkSrv = newServer(check)
		checkSrv.ConnState = checkIdle.ConnState
		// A check is at most 64 KiB: reading one takes no longer than its headers may. A
		// client dribbling a body cannot hold one of the face's few connections for long.
		checkSrv.ReadTimeout = cfg.ReadHeaderTimeout
	}
	var grpcSrv *grpc.Server
	if cfg.GRPCListen != "" {
		var hs *health.Server
		envoySlots := &decide.SlotRegistry{Memory: memory, Lease: cfg.InFlightEnvoyHold}
		envoySlots.Expired = m.WatchSlotRegistry(metrics.FaceRLS, envoySlots)
		slotRegs = append(slotRegs, envoySlots)
		grpcSrv, hs = rls.NewServer(&rls.Server{Engine: engine, Store: store, Holds: &decide.Registry{Memory: memory, Refused: m.RegistryRefused(metrics.FaceRLS)}, OnUnsized: m.UnsizedRefused, Slots: envoySlots}, rls.ServerOptions{
			IdleTimeout: cfg.IdleTimeout, HandshakeTimeout: cfg.ReadHeaderTimeout,
			Exposed: !onLoopback(cfg.GRPCListen),
		})
		healthSrv = hs
		if store.Current() != nil {
			rls.SetServing(hs)
		}
	}

	lns, err := listenAll(cfg, faceHooks{proxy: proxyIdle.CloseOldest, admin: adminIdle.CloseOldest, check: checkIdle.CloseOldest})
	if err != nil {
		return err
	}
	// The bound addresses, port 0 resolved: what a supervisor (or a test) connects to.
	log.Info("listening", "proxy", lns.proxy.Addr().String(), "admin", lns.admin.Addr().String(),
		"check", addrOf(lns.check), "grpc", addrOf(lns.grpc))

	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	bgWG.Go(func() {
		if err := loader.Run(bg); err != nil {
			log.Error("policy watcher stopped; the set in force stays", "error", err)
		}
	})
	bgWG.Go(func() { heartbeat(bg, cfg, log, client, store, instance, beat, m, lim) })
	sweepSlots(bg, &bgWG, slotRegs)

	serveErr := make(chan error, 4)
	serve := func(name string, f func() error) {
		go func() {
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				serveErr <- fmt.Errorf("serving %s: %w", name, err)
			}
		}()
	}
	serve("proxy", func() error { return proxySrv.Serve(lns.proxy) })
	serve("admin", func() error { return adminSrv.Serve(lns.admin) })
	if checkSrv != nil {
		serve("decision API", func() error { return checkSrv.Serve(lns.check) })
	}
	if grpcSrv != nil {
		serve("rate limit service", func() error { return grpcSrv.Serve(lns.grpc) })
	}
	log.Info("sidecar serving", "listen", lns.proxy.Addr().String(), "upstream", cfg.Upstream, "upstreamProtocol", cfg.UpstreamProtocol,
		"admin", lns.admin.Addr().String(), "check", cfg.CheckListen, "grpc", cfg.GRPCListen, "instance", instance,
		"failureModeOverride", cfg.FailureMode, "maxConns", cfg.MaxConns, "trustedHops", cfg.TrustedHops, "maxProcs", runtime.GOMAXPROCS(0))

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
	if checkSrv != nil {
		wg.Go(func() {
			if err := checkSrv.Shutdown(sctx); err != nil {
				log.Warn("decision API did not drain in time; closing", "error", err)
				_ = checkSrv.Close()
			}
		})
	}
	if grpcSrv != nil {
		healthSrv.Shutdown() // NOT_SERVING while calls in flight finish
		wg.Go(func() {
			if err := rls.Shutdown(sctx, grpcSrv); err != nil {
				log.Warn("rate limit service did not drain in time; closed", "error", err)
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

// sweepSlots runs each registry's sweep until ctx ends (decide.SlotRegistry.Run).
func sweepSlots(ctx context.Context, wg *sync.WaitGroup, regs []*decide.SlotRegistry) {
	for _, g := range regs {
		wg.Go(func() { g.Run(ctx) })
	}
}
