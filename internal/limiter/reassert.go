package limiter

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// reassertBatch is how many keys one pipeline of a re-assertion carries.
const reassertBatch = 256

// Reassert asks for a re-assertion of every share this replica holds in a live window (see
// shares.go): each key's state is raised to what this replica knows it was granted there. It
// returns at once; requests made while one runs coalesce into one more. The sidecar calls it
// when another replica saw Redis lose counts; the limiter calls it itself when a reply shows a
// loss and when Redis answers again after failing.
func (l *Limiter) Reassert() {
	// Slots too: the next Acquire renews them first (see slots.go).
	l.slotMarks.Add(1)
	if l.reassert == nil {
		return
	}
	select {
	case l.reassert <- struct{}{}:
	default:
	}
}

// reasserter runs re-assertions as they are asked for, and sweeps the share table. One that
// could not reach every key is run again a second later, until one does: on a cluster, the
// shard whose master died answers only once its replica has taken over, which the other
// shards' answers do not wait for.
func (l *Limiter) reasserter() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	retry := false
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
			if now := l.clock.deadline(time.Now()); now > 0 {
				l.shares.sweep(now / 1000)
			}
			if !retry {
				continue
			}
		case <-l.reassert:
		}
		retry = false
		if err := l.reassertAll(); err != nil {
			l.stats.reassertErrors.Add(1)
			retry = true
		}
	}
}

// reassertAll sends every live share to Redis, reassertBatch keys a pipeline, with a cost of 0:
// the scripts restore what is missing and count nothing else.
func (l *Limiter) reassertAll() error { return l.reassertWhere(nil) }

// reassertShard re-asserts the live shares of sh's keys: the other shards did not fail.
func (l *Limiter) reassertShard(sh *shard) error {
	if l.breakers.topo == nil {
		return l.reassertAll() // one shard
	}
	// By name, not by breaker: one pruned and made again for the same address is the same node.
	ctx := context.Background()
	return l.reassertWhere(func(key string) bool { return l.breakers.of(ctx, key).name == sh.name })
}

// reassertWhere re-asserts the live shares of the keys keep keeps (nil: every key's).
func (l *Limiter) reassertWhere(keep func(key string) bool) error {
	now := l.clock.deadline(time.Now())
	if now <= 0 {
		return nil // no reply yet, so no share either
	}
	live := l.shares.live(now / 1000)
	if keep != nil {
		live = slices.DeleteFunc(live, func(s liveShare) bool { return !keep(s.key) })
		if len(live) == 0 {
			return nil
		}
	}
	l.stats.reassertions.Add(1)
	var errs []error
	for len(live) > 0 {
		n := min(len(live), reassertBatch)
		if err := l.reassertBatch(live[:n]); err != nil {
			errs = append(errs, err)
		}
		live = live[n:]
		select {
		case <-l.quit:
			return errors.Join(errs...)
		default:
		}
	}
	return errors.Join(errs...)
}

func (l *Limiter) reassertBatch(batch []liveShare) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmds := make([]redis.Cmder, len(batch))
	for i, s := range batch {
		if s.cal != nil {
			cmds[i] = l.calendarReassertCmd(ctx, s)
			continue
		}
		cmd := redis.NewIntSliceCmd(ctx, "evalsha", shaArgs[s.alg], 1, s.key,
			1, s.window.Milliseconds(), 0, 0, 0, l.shares.id, s.start, s.cur, s.prev, s.hold, 0, s.lv)
		cmd.SetFirstKeyPos(3)
		cmds[i] = cmd
	}
	n := scripts.Exec(ctx, l.client, cmds, decisionScripts)
	l.stats.pipelines.Add(n.RoundTrips)
	l.stats.scriptLoads.Add(n.Loads)
	var first error
	for i, cmd := range cmds {
		vals, err := cmd.(*redis.IntSliceCmd).Result()
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if len(vals) == 7 && vals[6] > 0 {
			l.restored(batch[i].policy, vals[6])
		}
	}
	return first
}

// restored records that this replica's shares added units back to a limit of policy.
func (l *Limiter) restored(policy string, units int64) {
	l.stats.restorations.Add(1)
	l.stats.restoredUnits.Add(uint64(units))
	if l.opts.OnRestore != nil {
		l.opts.OnRestore(policy, units)
	}
}

func (l *Limiter) shareKeys() int {
	if l.shares == nil {
		return 0
	}
	return int(l.shares.n.Load())
}
