package limiter

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeartbeatOptions configure how a Limiter learns how many replicas share its limits.
type HeartbeatOptions struct {
	// Group names the set of replicas that share limits, e.g. "<namespace>/<deployment>".
	// Empty disables heartbeats; LocalFallback then divides by Options.Replicas.
	Group string
	// Instance identifies this replica in the group (default: the host name).
	Instance string
	// Interval is the time between heartbeats (default 5s).
	Interval time.Duration
	// TTL is how long a replica counts as live after its last heartbeat (default 3*Interval).
	TTL time.Duration
}

func (o HeartbeatOptions) withDefaults() HeartbeatOptions {
	if o.Instance == "" {
		o.Instance, _ = os.Hostname()
	}
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.TTL <= 0 {
		o.TTL = 3 * o.Interval
	}
	return o
}

var heartbeatScript = func() *redis.Script {
	src, err := luaFS.ReadFile("lua/heartbeat.lua")
	if err != nil {
		panic(fmt.Sprintf("embedded heartbeat script missing: %v", err))
	}
	return redis.NewScript(string(src))
}()

// HeartbeatKey is the sorted set that holds a group's live replicas, scored by Redis time.
func HeartbeatKey(group string) string {
	var b []byte
	b = append(b, "rl:hb:{"...)
	for i := 0; i < len(group); i++ {
		if c := group[i]; c == '{' || c == '}' {
			b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&0xF])
		} else {
			b = append(b, c)
		}
	}
	return string(append(b, '}'))
}

// Heartbeat records this replica as live and returns the group's live replica count, which
// LocalFallback divides by from then on. It needs Options.Heartbeat.Group.
func (l *Limiter) Heartbeat(ctx context.Context) (int, error) {
	hb := l.opts.Heartbeat
	if hb.Group == "" {
		return 0, fmt.Errorf("sending heartbeat: no heartbeat group configured")
	}
	n, err := heartbeatScript.Run(ctx, l.client, []string{HeartbeatKey(hb.Group)},
		hb.Instance, hb.TTL.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("sending heartbeat for %s in %s: %w", hb.Instance, hb.Group, err)
	}
	if n > 0 {
		l.replicas.Store(n)
	}
	return int(n), nil
}

// RunHeartbeat sends a heartbeat every Interval until ctx ends. Failures keep the last count
// seen, which is what LocalFallback needs while Redis is down; onError, if not nil, hears of them.
func (l *Limiter) RunHeartbeat(ctx context.Context, onError func(error)) {
	t := time.NewTicker(l.opts.Heartbeat.Interval)
	defer t.Stop()
	for {
		hctx, cancel := context.WithTimeout(ctx, l.opts.Heartbeat.Interval)
		_, err := l.Heartbeat(hctx)
		cancel()
		if err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SetReplicas overrides the replica count LocalFallback divides by, for deployments that know it
// without heartbeats.
func (l *Limiter) SetReplicas(n int) {
	l.replicas.Store(int64(max(n, 1)))
}

// Replicas returns the replica count LocalFallback divides by.
func (l *Limiter) Replicas() int { return int(l.replicas.Load()) }
