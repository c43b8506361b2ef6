package app

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

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
	taken := time.Now()
	for {
		if set := store.Current(); set != nil && len(set.Policies) > 0 {
			st := lim.Stats()
			lost := st.Restorations > told.Restorations
			// Each beat publishes what the rules counted since the last one: who they refused,
			// and what their candidates would have (see ruleset.Set.Summaries).
			at := time.Now()
			tops := set.Summaries(at.Sub(taken))
			taken = at
			hctx, cancel := context.WithTimeout(ctx, cfg.HeartbeatInterval)
			beats, err := fleet.BeatWithSummaries(hctx, client, set.Namespace, instance, set.Hash, ttl, set.PolicyNames(), lost, tops)
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
