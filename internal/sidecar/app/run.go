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
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
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

// sidecar is the running sidecar's parts, built by run's steps in order.
type sidecar struct {
	cfg      *Config
	log      *slog.Logger
	instance string
	client   redis.UniversalClient
	store    *ruleset.Store
	beat     chan struct{} // a heartbeat now, not at the next tick
	lim      *limiter.Limiter
	m        *metrics.Metrics
	loader   *ruleset.Loader
	engine   *decide.Engine
	memory   *membudget.Budget
	ph       *proxy.Handler
	// healthSrv is the gRPC health service, set before the watcher starts reloading.
	healthSrv *health.Server
	draining  atomic.Bool

	proxySrv, adminSrv, checkSrv *http.Server
	grpcSrv                      *grpc.Server
	// On every HTTP face, idle keep-alive connections make room for new ones at the face's
	// bound (connlimit.IdleCloser).
	proxyIdle, adminIdle, checkIdle connlimit.IdleCloser
	// The slots the decision faces keep for their clients: released when a client neither
	// renews nor releases them within their lease (a check client renews; Envoy cannot).
	slotRegs []*decide.SlotRegistry
}

func run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	// go-redis logs dial failures through its own printf logger; the breaker, the metrics and
	// our structured logs already report an unreachable Redis.
	redis.SetLogger(silentRedisLogger{})
	s := &sidecar{cfg: cfg, log: log, instance: cfg.PodName, store: &ruleset.Store{}, beat: make(chan struct{}, 1)}
	if s.instance == "" {
		s.instance, _ = os.Hostname()
	}
	conns := &redisconn.ConnStats{}
	client, err := newRedisClient(cfg, log, conns)
	if err != nil {
		return err
	}
	defer client.Close()
	s.client = client
	if err := s.decisions(conns); err != nil {
		return err
	}
	if err := s.servers(); err != nil {
		return err
	}
	lns, err := listenAll(cfg, faceHooks{proxy: s.proxyIdle.CloseOldest, admin: s.adminIdle.CloseOldest, check: s.checkIdle.CloseOldest})
	if err != nil {
		return err
	}
	// The bound addresses, port 0 resolved: what a supervisor (or a test) connects to.
	log.Info("listening", "proxy", lns.proxy.Addr().String(), "admin", lns.admin.Addr().String(),
		"check", addrOf(lns.check), "grpc", addrOf(lns.grpc))

	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	bgWG.Go(func() {
		if err := s.loader.Run(bg); err != nil {
			log.Error("policy watcher stopped; the set in force stays", "error", err)
		}
	})
	bgWG.Go(func() { heartbeat(bg, cfg, log, client, s.store, s.instance, s.beat, s.m, s.lim) })
	sweepSlots(bg, &bgWG, s.slotRegs)

	serveErr := s.serve(lns)
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout.String())
	case runErr = <-serveErr:
		log.Error("a listener failed; shutting down", "error", runErr)
	}
	s.shutdown(runErr)
	stopBG()
	bgWG.Wait()
	s.lim.Close()
	log.Info("sidecar stopped")
	return runErr
}

// newRedisClient is the sidecar's Redis client. Connections open lazily and idle ones close:
// nothing at start needs Redis (readiness is the policies file; the heartbeat and the scripts
// dial when they first run).
func newRedisClient(cfg *Config, log *slog.Logger, conns *redisconn.ConnStats) (redis.UniversalClient, error) {
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
		return nil, fmt.Errorf("creating redis client: %w", err)
	}
	return client, nil
}

// decisions builds what decides: the limiter, the metrics, the policy loader (with a first
// load), the decision log, the engine, the memory budget and the proxy handler.
func (s *sidecar) decisions(conns *redisconn.ConnStats) error {
	cfg, log := s.cfg, s.log
	var restoredTo atomic.Pointer[metrics.Metrics] // set once the metrics exist, before any decision
	lim, err := newLimiter(s.client, conns, cfg, s.store, s.beat, &restoredTo)
	if err != nil {
		return err
	}
	s.lim = lim
	m := metrics.New(lim.Stats, s.store)
	s.m = m
	restoredTo.Store(m)
	builder := ruleset.NewBuilder(limiter.FailureMode(cfg.FailureMode))
	builder.Namespace = cfg.PodNamespace
	s.client.AddHook(m.RedisHook())
	m.WatchPool(s.client, conns, cfg.RedisPoolSize)
	m.WatchSlots(lim.SlotStats)
	s.loader = &ruleset.Loader{
		Dir: cfg.ConfigDir, LabelsFile: cfg.PodLabels, Builder: builder,
		Store: s.store, Log: log, Resync: cfg.Resync, OnError: func(error) { m.ReloadFailed() },
		OnLoad: func(set *ruleset.Set) {
			m.ConfigLoaded(set)
			if hs := s.healthSrv; hs != nil {
				rls.SetServing(hs)
			}
			select { // announce the new policy set without waiting for the next beat
			case s.beat <- struct{}{}:
			default:
			}
		},
	}
	if err := s.loader.Load(); err != nil {
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
	s.memory = memoryBudget(cfg, log)
	s.engine = &decide.Engine{Limiter: lim, TrustedHops: cfg.TrustedHops, Observe: m.Observe, ObserveSettle: m.Settled, ObserveSlot: m.ObserveSlot, OnSlots: m.SlotsHeld,
		OnLetFinish: m.SlotLetFinish, Queue: &slotqueue.Queue{Max: cfg.InFlightQueueMax, Memory: s.memory}, OnQueued: m.SlotsQueued, Log: decisionLog}
	m.WatchMemory(s.memory.Stats)
	s.ph, err = proxy.New(proxy.Options{
		Upstream: cfg.Upstream, UpstreamProtocol: cfg.UpstreamProtocol, MaxStreams: cfg.MaxConns, Engine: s.engine, Store: s.store, Headers: cfg.RateLimitHeaders,
		QueueShare:            queueShare(cfg.MaxConns),
		ResponseHeaderTimeout: cfg.RequestTimeout, Memory: s.memory, OnUnsized: m.UnsizedRefused, Log: log,
	})
	return err
}

// servers builds the faces' servers: the proxy, the admin face and, where turned on, the
// decision API and the rate limit service.
func (s *sidecar) servers() error {
	cfg := s.cfg
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
			MaxHeaderBytes: cfg.MaxHeaderBytes, ErrorLog: errLog,
		}
	}
	s.proxySrv = newServer(s.ph)
	proxy.ServeProtocols(s.proxySrv) // h2c beside HTTP/1.1
	s.proxySrv.ConnState = s.proxyIdle.ConnState
	s.adminSrv = newAdminServer(adminMux(cfg, s.store, s.m, &s.draining), errLog)
	s.adminSrv.ConnState = s.adminIdle.ConnState
	if cfg.CheckListen != "" {
		checkSlots := s.keptSlots(cfg.InFlightExpiry, cfg.InFlightMaxRenew)
		checkSlots.Expired = s.m.WatchSlotRegistry(metrics.FaceCheck, checkSlots)
		s.slotRegs = append(s.slotRegs, checkSlots)
		check := http.NewServeMux()
		check.Handle(checkapi.Path, &checkapi.Handler{Engine: s.engine, Store: s.store, Holds: &decide.Registry{Memory: s.memory, Refused: s.m.RegistryRefused(metrics.FaceCheck)}, OnUnsized: s.m.UnsizedRefused, Slots: checkSlots,
			QueueShare: queueShare(cfg.MaxCheckConns)})
		check.Handle(checkapi.TopKeysPath, &checkapi.TopKeysHandler{Store: s.store})
		s.checkSrv = newServer(check)
		s.checkSrv.ConnState = s.checkIdle.ConnState
		// A check is at most 64 KiB: reading one takes no longer than its headers may. A
		// client dribbling a body cannot hold one of the face's few connections for long.
		s.checkSrv.ReadTimeout = cfg.ReadHeaderTimeout
	}
	if cfg.GRPCListen != "" {
		var hs *health.Server
		envoySlots := s.keptSlots(cfg.InFlightEnvoyHold, 0)
		envoySlots.Expired = s.m.WatchSlotRegistry(metrics.FaceRLS, envoySlots)
		s.slotRegs = append(s.slotRegs, envoySlots)
		s.grpcSrv, hs = rls.NewServer(&rls.Server{Engine: s.engine, Store: s.store, Holds: &decide.Registry{Memory: s.memory, Refused: s.m.RegistryRefused(metrics.FaceRLS)}, OnUnsized: s.m.UnsizedRefused, Slots: envoySlots}, rls.ServerOptions{
			IdleTimeout: cfg.IdleTimeout, HandshakeTimeout: cfg.ReadHeaderTimeout,
			Exposed: !onLoopback(cfg.GRPCListen),
		})
		s.healthSrv = hs
		if s.store.Current() != nil {
			rls.SetServing(hs)
		}
	}
	return nil
}

// keptSlots is a face's registry of the slots it keeps for its clients, leased for lease and
// renewable up to maxRenew (0: Envoy cannot renew). It keeps at most a quarter of the
// limiter's slot table and of the memory budget: the clients of one face, however many ids
// they keep, leave room for the proxy's requests and the other face's.
func (s *sidecar) keptSlots(lease, maxRenew time.Duration) *decide.SlotRegistry {
	return &decide.SlotRegistry{Memory: s.memory, Lease: lease, MaxRenew: maxRenew,
		MaxSlots: limiter.MaxSlots / keptShare, MaxBytes: s.memory.Stats().Size / keptShare}
}

// keptShare: each face's registry keeps at most 1/keptShare of the slot table and the budget.
const keptShare = 4

// serve serves every face on its listener; the channel receives the first failure.
func (s *sidecar) serve(lns *listeners) <-chan error {
	cfg := s.cfg
	serveErr := make(chan error, 4)
	serve := func(name string, f func() error) {
		go func() {
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				serveErr <- fmt.Errorf("serving %s: %w", name, err)
			}
		}()
	}
	serve("proxy", func() error { return s.proxySrv.Serve(lns.proxy) })
	serve("admin", func() error { return s.adminSrv.Serve(lns.admin) })
	if s.checkSrv != nil {
		serve("decision API", func() error { return s.checkSrv.Serve(lns.check) })
	}
	if s.grpcSrv != nil {
		serve("rate limit service", func() error { return s.grpcSrv.Serve(lns.grpc) })
	}
	s.log.Info("sidecar serving", "listen", lns.proxy.Addr().String(), "upstream", cfg.Upstream, "upstreamProtocol", cfg.UpstreamProtocol,
		"admin", lns.admin.Addr().String(), "check", cfg.CheckListen, "grpc", cfg.GRPCListen, "instance", s.instance,
		"failureModeOverride", cfg.FailureMode, "maxConns", cfg.MaxConns, "trustedHops", cfg.TrustedHops, "maxProcs", runtime.GOMAXPROCS(0))
	return serveErr
}

// shutdown drains the faces: not ready first (after ShutdownDelay, unless a face failed), then
// the traffic faces at once within ShutdownTimeout, the admin face last.
func (s *sidecar) shutdown(runErr error) {
	cfg, log := s.cfg, s.log
	s.draining.Store(true)
	if cfg.ShutdownDelay > 0 && runErr == nil {
		time.Sleep(cfg.ShutdownDelay)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.proxySrv.Shutdown(sctx); err != nil {
			log.Warn("proxy did not drain in time; closing", "error", err)
			_ = s.proxySrv.Close()
		}
		s.ph.Close() // the idle connections to the application
	})
	if s.checkSrv != nil {
		wg.Go(func() {
			if err := s.checkSrv.Shutdown(sctx); err != nil {
				log.Warn("decision API did not drain in time; closing", "error", err)
				_ = s.checkSrv.Close()
			}
		})
	}
	if s.grpcSrv != nil {
		s.healthSrv.Shutdown() // NOT_SERVING while calls in flight finish
		wg.Go(func() {
			if err := rls.Shutdown(sctx, s.grpcSrv); err != nil {
				log.Warn("rate limit service did not drain in time; closed", "error", err)
			}
		})
	}
	wg.Wait()
	// Admin last: health and metrics stay answerable while traffic drains.
	_ = s.adminSrv.Shutdown(sctx)
}

// sweepSlots runs each registry's sweep until ctx ends (decide.SlotRegistry.Run).
func sweepSlots(ctx context.Context, wg *sync.WaitGroup, regs []*decide.SlotRegistry) {
	for _, g := range regs {
		wg.Go(func() { g.Run(ctx) })
	}
}

// queueShare bounds a face's waiters for a slot: at most half the face's connections (conns),
// since each waiter holds one. A flood of waiters on full keys (a tenant may allow 10,000 a
// key for 10 minutes) then leaves the other half to the other keys' requests: the waiters
// beyond it are refused at once, and their idle keep-alive connections can be closed for new
// ones. --in-flight-queue-max bounds the waiters of both faces together.
func queueShare(conns int) *slotqueue.Share { return &slotqueue.Share{Max: max(1, conns/2)} }
