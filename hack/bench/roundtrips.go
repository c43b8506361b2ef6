package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
)

// The workloads of the round-trip cells.
const (
	// workAdmit spreads decisions over many keys under a limit never reached: every decision
	// must run the script, so only batching can save round trips.
	workAdmit = "under limit"
	// workRefuse hammers a few keys far over their limit: most decisions are refusals, which the
	// pre-check can repeat locally.
	workRefuse = "over limit"
)

// The limits are one replica's, as a sidecar's heartbeat says (the limiter leases only once
// the live replicas are known), and every engine keeps its shares, as a sidecar does.
var (
	admitLimit  = limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Requests: benchLimit, Window: time.Minute, Replicas: 1, Peers: 1}
	refuseLimit = limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Requests: 10, Window: time.Minute, Replicas: 1, Peers: 1}
)

// RoundTripCell is one way of deciding under one workload.
type RoundTripCell struct {
	Mode     string `json:"mode"`
	Workload string `json:"workload"`
	Cell
	// RoundTrips is client round trips (one per command or pipeline) per decision.
	RoundTrips float64 `json:"roundTripsPerDecision"`
	// Commands is commands Redis executed per decision, from INFO commandstats.
	Commands float64 `json:"redisCommandsPerDecision"`
	// Refused is the share of decisions refused.
	Refused float64 `json:"refusedShare"`
	// Allocs is heap allocations per decision in this process (the load loop's included).
	Allocs float64 `json:"allocsPerDecision"`
}

// tripCounter is a go-redis hook counting round trips: one per command, one per pipeline.
type tripCounter struct{ n atomic.Int64 }

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// decider decides one request for key under limit; refused reports a refusal.
type decider func(ctx context.Context, key string, limit limiter.Limit) (refused bool, err error)

// rtMode is one way of deciding, built on a fresh client.
type rtMode struct {
	name  string
	build func(c redis.UniversalClient) (decider, func(), error)
}

// engine returns the limiter engine with batching, pre-check and leases on or off.
func engine(name string, batch, precheck, leases bool) rtMode {
	return rtMode{name, func(c redis.UniversalClient) (decider, func(), error) {
		o := limiter.Options{LeaseHorizon: -1, ReplicaID: limiter.NewReplicaID()}
		if leases {
			o.LeaseHorizon = 0 // the default
		}
		if !batch {
			o.MaxBatch = 1
		}
		if !precheck {
			o.PrecheckSize = -1
		}
		l, err := limiter.New(c, o)
		if err != nil {
			return nil, nil, fmt.Errorf("creating the limiter: %w", err)
		}
		return func(ctx context.Context, key string, limit limiter.Limit) (bool, error) {
			r, err := l.Allow(ctx, key, limit, 1)
			if err != nil {
				return false, fmt.Errorf("allow: %w", err)
			}
			if r.Source != limiter.SourceRedis && r.Source != limiter.SourcePrecheck && r.Source != limiter.SourceLease {
				return false, fmt.Errorf("decision from %s: %w", r.Source, r.Err)
			}
			return !r.Allowed, nil
		}, l.Close, nil
	}}
}

var rtModes = []rtMode{
	{"naive INCR+EXPIRE", func(c redis.UniversalClient) (decider, func(), error) {
		return func(ctx context.Context, key string, limit limiter.Limit) (bool, error) {
			n, err := c.Incr(ctx, key+":naive").Result()
			if err != nil {
				return false, fmt.Errorf("INCR: %w", err)
			}
			if err := c.Expire(ctx, key+":naive", limit.Window).Err(); err != nil {
				return false, fmt.Errorf("EXPIRE: %w", err)
			}
			return n > limit.Requests, nil
		}, func() {}, nil
	}},
	{"EVALSHA per decision", func(c redis.UniversalClient) (decider, func(), error) {
		sha := scripts.SHAs()[string(limiter.SlidingWindowCounter)]
		return func(ctx context.Context, key string, limit limiter.Limit) (bool, error) {
			r, err := c.EvalSha(ctx, sha, []string{key + ":swc"}, limit.Requests, limit.Window.Milliseconds(), 1, 0).Int64Slice() // cost 1, no deadline
			if err != nil {
				return false, fmt.Errorf("EVALSHA: %w", err)
			}
			return len(r) == 0 || r[0] != 1, nil
		}, func() {}, nil
	}},
	engine("engine, no batching, no pre-check", false, false, false),
	engine("engine, batching, no pre-check", true, false, false),
	engine("engine, no batching, pre-check", false, true, false),
	engine("engine, batching + pre-check", true, true, false),
	engine("engine, batching + pre-check + leases (default)", true, true, true),
}

// runRoundTrips measures every mode under both workloads at each concurrency of concs.
func runRoundTrips(ctx context.Context, url string, concs []int, b Bounds) ([]RoundTripCell, error) {
	var out []RoundTripCell
	for _, work := range []string{workAdmit, workRefuse} {
		for i, m := range rtModes {
			for _, conc := range concs {
				tag := fmt.Sprintf("%d-%s-%d", i, strings.ReplaceAll(work, " ", ""), conc)
				c, err := rtCell(ctx, url, m, work, tag, conc, b)
				if err != nil {
					return nil, fmt.Errorf("%s, %s, %d callers: %w", m.name, work, conc, err)
				}
				progress("  %-40s %-11s %4d callers %8.0f/s  round trips/decision %.3f  commands/decision %.3f  allocs/decision %.1f  refused %.0f%%",
					m.name, work, conc, c.PerSec, c.RoundTrips, c.Commands, c.Allocs, 100*c.Refused)
				out = append(out, c)
			}
		}
	}
	return out, nil
}

func rtCell(ctx context.Context, url string, m rtMode, work, tag string, conc int, b Bounds) (RoundTripCell, error) {
	c, err := redisconn.NewClient(url, redisconn.Options{PoolSize: 64, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second})
	if err != nil {
		return RoundTripCell{}, fmt.Errorf("connecting: %w", err)
	}
	defer c.Close()
	if _, err := scripts.Load(ctx, c); err != nil {
		return RoundTripCell{}, fmt.Errorf("loading scripts: %w", err)
	}
	decide, closeFn, err := m.build(c)
	if err != nil {
		return RoundTripCell{}, err
	}
	defer closeFn()
	limit, nkeys := admitLimit, int64(1024)
	if work == workRefuse {
		limit, nkeys = refuseLimit, 64
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = keyscheme.Key(benchNamespace, "roundtrips-"+tag, "rule", strconv.Itoa(i))
	}
	trips := &tripCounter{}
	c.AddHook(trips)
	var refused atomic.Int64
	fn := func(ctx context.Context, i int64) error {
		r, err := decide(ctx, keys[(i%nkeys+nkeys)%nkeys], limit)
		if r && i >= 0 {
			refused.Add(1)
		}
		return err
	}
	// Warm up outside the measurement, then read the counters.
	b.Warmup = max(b.Warmup, 2*conc)
	for i := range b.Warmup {
		if err := fn(ctx, -1-int64(i)); err != nil {
			return RoundTripCell{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	cmdsBefore, err := redisCommands(ctx, c)
	if err != nil {
		return RoundTripCell{}, err
	}
	tripsBefore := trips.n.Load()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	mallocsBefore := mem.Mallocs
	b.Warmup = 0
	cell, err := closedLoop(ctx, conc, b, fn)
	if err != nil {
		return RoundTripCell{}, err
	}
	runtime.ReadMemStats(&mem)
	mallocs := mem.Mallocs - mallocsBefore
	tripsAfter := trips.n.Load()
	cmdsAfter, err := redisCommands(ctx, c)
	if err != nil {
		return RoundTripCell{}, err
	}
	n := float64(cell.Ops + cell.Errors)
	return RoundTripCell{Mode: m.name, Workload: work, Cell: cell,
		RoundTrips: float64(tripsAfter-tripsBefore) / n,
		Commands:   float64(cmdsAfter-cmdsBefore) / n,
		Refused:    float64(refused.Load()) / n,
		Allocs:     float64(mallocs) / n}, nil
}

// decisionCommands are the commands a decision sends to Redis. The commands scripts run
// inside Redis (TIME, HMGET, ...) are counted by commandstats too, but are not round trips.
var decisionCommands = map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "incr": true, "expire": true, "script|load": true}

// redisCommands is the total of decisionCommands Redis has executed, from INFO commandstats.
func redisCommands(ctx context.Context, c redis.UniversalClient) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		if !decisionCommands[strings.TrimPrefix(name, "cmdstat_")] {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("commandstats line %q: %w", line, err)
		}
		total += n
	}
	return total, nil
}

var rpsRE = regexp.MustCompile(`([0-9.]+) requests per second`)

// Ceiling is what redis-benchmark gets out of this Redis with the same script.
type Ceiling struct {
	Pipeline int     `json:"pipeline"`
	Clients  int     `json:"clients"`
	Requests int     `json:"requests"`
	PerSec   float64 `json:"perSec"`
}

// redisBenchmark runs redis-benchmark -P pipeline with the SlidingWindowCounter script (the
// one the faces run) over 1024 random keys under a limit never reached: the most this machine's
// Redis can decide. It is bounded by its request count and by ctx.
func redisBenchmark(ctx context.Context, port int, pipeline, requests int) (Ceiling, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	sha := scripts.SHAs()[string(limiter.SlidingWindowCounter)]
	out, err := exec.CommandContext(ctx, "redis-benchmark", "-h", "127.0.0.1", "-p", strconv.Itoa(port),
		"-P", strconv.Itoa(pipeline), "-c", "50", "-n", strconv.Itoa(requests), "-r", "1024", "-q",
		"EVALSHA", sha, "1", "rl:{bench/ceiling/rule/__rand_int__}:swc",
		strconv.FormatInt(admitLimit.Requests, 10), strconv.FormatInt(admitLimit.Window.Milliseconds(), 10), "1").CombinedOutput()
	if err != nil {
		return Ceiling{}, fmt.Errorf("redis-benchmark -P %d: %w\n%s", pipeline, err, out)
	}
	m := rpsRE.FindAllSubmatch(out, -1)
	if len(m) == 0 {
		return Ceiling{}, fmt.Errorf("no requests per second in redis-benchmark output:\n%s", out)
	}
	v, err := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	if err != nil {
		return Ceiling{}, fmt.Errorf("parsing redis-benchmark output: %w", err)
	}
	return Ceiling{Pipeline: pipeline, Clients: 50, Requests: requests, PerSec: v}, nil
}
