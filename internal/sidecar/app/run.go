package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/connlimit"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/decide"
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
	engine := &decide.Engine{Limiter: lim, TrustedHops: cfg.TrustedHops, Observe: m.Observe}
	ph, err := proxy.New(proxy.Options{
		Upstream: cfg.Upstream, Engine: engine, Store: store, Headers: cfg.RateLimitHeaders,
		ResponseHeaderTimeout: cfg.RequestTimeout, Log: log,
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
	proxySrv.ConnState = proxyIdle.ConnState
	adminSrv := newAdminServer(admin, errLog)
	adminSrv.ConnState = adminIdle.ConnState
	var checkSrv *http.Server
	if cfg.CheckListen != "" {
		check := http.NewServeMux()
		check.Handle(checkapi.Path, &checkapi.Handler{Engine: engine, Store: store})
		checkSrv = newServer(check)
		checkSrv.ConnState = checkIdle.ConnState
		// A check is at most 64 KiB: reading one takes no longer than its headers may. A
		// client dribbling a body cannot hold one of the face's few connections for long.
		checkSrv.ReadTimeout = cfg.ReadHeaderTimeout
	}
	var grpcSrv *grpc.Server
	if cfg.GRPCListen != "" {
		var hs *health.Server
		grpcSrv, hs = rls.NewServer(&rls.Server{Engine: engine, Store: store}, rls.ServerOptions{
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
	log.Info("sidecar serving", "listen", lns.proxy.Addr().String(), "upstream", cfg.Upstream,
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

// faceHooks are what each HTTP face does at its connection bound: close its longest-idle
// keep-alive connection.
type faceHooks struct{ proxy, admin, check func() bool }

// listeners are the sidecar's sockets.
type listeners struct {
	proxy, admin, check, grpc net.Listener
}

// addrOf is ln's address, or "" for a face turned off.
func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// onLoopback reports whether addr ("host:port") listens on a loopback address only: then its
// peers are the pod's own containers.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// listenAll opens every configured address, or none. Every face is bounded (connlimit): in
// all, so that one client opening sockets without end cannot exhaust the sidecar's memory or
// descriptors, and per remote IP, so that one peer cannot take every slot. A face on loopback
// has no per-IP bound: its only peers are the pod's own containers, all of them 127.0.0.1.
// Each face's onFull hook runs when it reaches its bound.
func listenAll(cfg *Config, onFull faceHooks) (*listeners, error) {
	var (
		lns    listeners
		opened []net.Listener
	)
	open := func(what, addr string, lim connlimit.Limits, full func() bool) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range opened {
				_ = l.Close()
			}
			return nil, fmt.Errorf("listening for %s on %s: %w", what, addr, err)
		}
		opened = append(opened, ln)
		if onLoopback(ln.Addr().String()) {
			lim.PerIP = 0
		}
		var hook func()
		if full != nil {
			hook = func() { full() }
		}
		return connlimit.Listen(ln, lim, hook), nil
	}
	var err error
	if lns.proxy, err = open("the proxy", cfg.Listen, connlimit.Limits{Max: cfg.MaxConns, PerIP: cfg.MaxConnsPerIP}, onFull.proxy); err != nil {
		return nil, err
	}
	if lns.admin, err = open("admin", cfg.AdminListen, connlimit.Limits{Max: cfg.MaxAdminConns, PerIP: cfg.MaxAdminConnsPerIP}, onFull.admin); err != nil {
		return nil, err
	}
	if cfg.CheckListen != "" {
		if lns.check, err = open("the decision API", cfg.CheckListen, connlimit.Limits{Max: cfg.MaxCheckConns, PerIP: cfg.MaxCheckConnsPerIP}, onFull.check); err != nil {
			return nil, err
		}
	}
	if cfg.GRPCListen != "" {
		if lns.grpc, err = open("the rate limit service", cfg.GRPCListen, connlimit.Limits{Max: cfg.MaxGRPCConns, PerIP: cfg.MaxGRPCConnsPerIP}, nil); err != nil {
			return nil, err
		}
	}
	return &lns, nil
}

// newLimiter makes the sidecar's limiter. Its shares' restorations are counted in the
// metrics m will hold, and start a heartbeat at once (beat), which tells the other replicas.
func newLimiter(client redis.UniversalClient, cfg *Config, store *ruleset.Store, beat chan<- struct{},
	m *atomic.Pointer[metrics.Metrics]) (*limiter.Limiter, error) {
	leaseHorizon := cfg.LeaseHorizon
	if leaseHorizon <= 0 {
		leaseHorizon = -1 // off: every decision asks Redis
	}
	lim, err := limiter.New(client, limiter.Options{LeaseHorizon: leaseHorizon, LeaseSize: cfg.LeaseKeys,
		// A script that runs after the client's read timeout would count units for a caller
		// already answered by the failure mode; a quarter of the timeout is left for its reply.
		CallDeadline: cfg.RedisTimeout * 3 / 4,
		// A fresh id per process: a restarted sidecar knows none of its old grants anyway.
		ReplicaID: limiter.NewReplicaID(), ShareKeys: cfg.ShareKeys,
		// The other replicas hear of a loss at their next heartbeat (the restoring one beats
		// at once) and re-assert within a round trip: a second beyond the interval.
		RestoreHold: cfg.HeartbeatInterval + time.Second,
		OnRestore: func(key string, units int64) {
			if mm := m.Load(); mm != nil {
				mm.Restored(policyOfKey(store.Current(), key), units)
			}
			select { // tell the other replicas at once: they re-assert when they hear of it
			case beat <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("creating limiter: %w", err)
	}
	return lim, nil
}

// heartbeat announces this replica in the group of every policy it enforces while Redis is
// reachable, and records each group's live count for LocalFallback. It is also how replicas
// tell each other that Redis lost counts: a beat after this replica restored some says so,
// and a replica that sees a group's losses change, or finds Redis no longer holding its own
// last beat, re-asserts every share it holds (see limiter's shares.go).
func heartbeat(ctx context.Context, cfg *Config, log *slog.Logger, client redis.UniversalClient, store *ruleset.Store,
	instance string, now <-chan struct{}, m *metrics.Metrics, lim *limiter.Limiter) {
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	ttl := fleet.TTL(cfg.HeartbeatInterval)
	failing := false
	var failedSince time.Time
	// lives are a group's last live counts, newest at lives[n % len]: their most is the
	// group's Peers. A count read after a failover may be short (the new master's heartbeats
	// lag like its counts), so a hold ends only once as many replicas as were live before it
	// re-asserted; a replica gone for good stops counting after len beats (the heartbeat TTL
	// is three intervals by default).
	type seen struct {
		losses, last int64
		lives        [4]int64
		n            int
	}
	groups := map[string]seen{}
	told := lim.Stats()
	for {
		if set := store.Current(); set != nil && len(set.Policies) > 0 {
			st := lim.Stats()
			lost := st.Restorations > told.Restorations
			hctx, cancel := context.WithTimeout(ctx, cfg.HeartbeatInterval)
			beats, err := fleet.Beat(hctx, client, set.Namespace, instance, set.Hash, ttl, set.PolicyNames(), lost)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				m.HeartbeatFailed()
				if !failing {
					log.Warn("heartbeat failed; LocalFallback keeps the last replica counts", "error", err)
					failedSince = time.Now()
				}
				failing = true
			case err == nil:
				if failing {
					log.Info("heartbeat recorded again", "failedFor", time.Since(failedSince).Round(time.Millisecond).String())
					// Redis answers again: perhaps another node, or the same one restarted
					// empty. A replica deciding from its leases meanwhile made no call that
					// would have told its limiter so.
					lim.Reassert()
				}
				failing = false
				if lost {
					log.Warn("Redis had lost counts this replica was granted (a failover to a replica that lagged, or a restart); restored them from this replica's shares",
						"windows", st.Restorations-told.Restorations, "units", st.RestoredUnits-told.RestoredUnits)
				}
				told = st
				signal := ""
				for i, p := range set.Policies {
					b := beats[i]
					g, known := groups[p.Name]
					switch {
					case !known:
					case b.Losses != g.losses && (!lost || b.Losses != g.losses+1):
						signal = "another replica of policy " + p.Name + " found Redis short of its shares"
					case b.Previous < g.last:
						signal = "Redis no longer holds this replica's last heartbeat of policy " + p.Name
					}
					g.losses, g.last = b.Losses, b.Now
					g.lives[g.n%len(g.lives)] = b.Live
					g.n++
					groups[p.Name] = g
					p.Replicas.Store(b.Live)
					p.Peers.Store(slices.Max(g.lives[:]))
				}
				if signal != "" {
					log.Warn("Redis may have lost counts: re-asserting every share of this replica", "why", signal)
					m.LossSignalled()
					lim.Reassert()
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

// policyOfKey names the policy of a limiter state key (rl:{<namespace>/<policy>/...}) among
// the policies of set, for a metric label: "unknown" for none, so that the label's values are
// bounded by the document's policies.
func policyOfKey(set *ruleset.Set, key string) string {
	rest, ok := strings.CutPrefix(key, "rl:{")
	if !ok || set == nil {
		return "unknown"
	}
	_, rest, _ = strings.Cut(rest, "/")
	part, _, _ := strings.Cut(rest, "/")
	for _, p := range set.Policies {
		if limiter.KeyPart(p.Name) == part {
			return p.Name
		}
	}
	return "unknown"
}
