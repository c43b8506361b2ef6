package limiter

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Renewing and re-asserting the in-flight slots this replica holds (see slots.go).

// slotRenewer renews every slot this replica holds each SlotExpiry/4, until Close.
func (l *Limiter) slotRenewer() {
	every := l.opts.SlotExpiry / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
			_ = l.renewSlots(every) // counted; a failure makes the next Acquire renew first
		}
	}
}

// reassertSlots renews every slot this replica holds when it saw Redis fail since its last
// complete renewal (slotsSuspect): the node that answers now may be a promoted replica, or the
// same one restarted, without some of them, and a slot taken before they are re-asserted could
// take a place a running request of this replica holds. Callers that find it running wait for
// it. Its error says the renewal did not reach every key.
func (l *Limiter) reassertSlots() error {
	if !l.slotsSuspect() {
		return nil
	}
	return l.renewSlots(l.opts.SlotExpiry / 4)
}

// markSlotsSuspect says Redis may have lost slots: the next Acquire renews first.
func (l *Limiter) markSlotsSuspect() { l.slotMarks.Add(1) }

// slotsSuspect says Redis was found suspect since the start of the last complete renewal.
func (l *Limiter) slotsSuspect() bool { return l.slotMarks.Load() > l.slotCleared.Load() }

// fenceSlots keeps new slots on the failure mode for half the expiry from now.
func (l *Limiter) fenceSlots(now time.Time) {
	until := now.Add(l.opts.SlotExpiry / 2).UnixNano()
	for {
		cur := l.slotFence.Load()
		if cur >= until || l.slotFence.CompareAndSwap(cur, until) {
			return
		}
	}
}

// renewSlots renews every held slot in one pipeline, re-asserts those Redis no longer counted
// where their key has room, and loses the others and those whose expiry would pass before the
// next round. One runs at a time. Its error is the first of a call that failed; when none did,
// Redis is no longer suspect for what was found before it began.
func (l *Limiter) renewSlots(every time.Duration) error {
	l.slotRenewMu.Lock()
	defer l.slotRenewMu.Unlock()
	marks := l.slotMarks.Load()
	suspect := marks > l.slotCleared.Load()
	byKey := l.slotBook.snapshot()
	if len(byKey) == 0 {
		l.settled(suspect, marks)
		return nil
	}
	l.slotStats.renewals.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	calls := l.slotRenewCalls(ctx, byKey)
	cmds := make([]redis.Cmder, len(calls))
	for i, c := range calls {
		cmds[i] = c.cmd
	}
	start := time.Now()
	l.stats.scriptLoads.Add(scripts.Exec(ctx, l.client, cmds, slotScripts).Loads)
	var first error
	for _, c := range calls {
		if err := l.renewed(c, start); err != nil {
			l.slotStats.renewErrors.Add(1)
			first = cmp.Or(first, err)
		}
	}
	// A slot not renewed in time is given up before Redis lets it go: its expiry would pass
	// before the next round could renew it.
	horizon := time.Now().Add(every + every/2).UnixNano()
	for _, slots := range byKey {
		for _, s := range slots {
			if s.deadline.Load() < horizon {
				l.loseSlot(s)
			}
		}
	}
	if first != nil {
		l.markSlotsSuspect()
		return fmt.Errorf("renewing in-flight slots: %w", first)
	}
	l.settled(suspect, marks)
	return nil
}

// slotRenewCall is one call of a renewal: up to slotRenewIDs slots of one key.
type slotRenewCall struct {
	cmd           *redis.Cmd
	slots         []*Slot
	shard, before string // the key's shard and its history when the call was made
}

func (l *Limiter) slotRenewCalls(ctx context.Context, byKey map[string][]*Slot) []slotRenewCall {
	ttl := l.opts.SlotExpiry
	var calls []slotRenewCall
	for key, slots := range byKey {
		shard := l.slotShard(ctx, key)
		before := l.slotLineages.of(shard)
		limit := slots[0].max
		for _, s := range slots {
			limit = min(limit, s.max) // a reload may have lowered it: re-assert under the least
		}
		for len(slots) > 0 {
			n := min(len(slots), slotRenewIDs)
			args := make([]any, 0, n+2)
			args = append(args, ttl.Milliseconds(), limit)
			for _, s := range slots[:n] {
				args = append(args, s.id)
			}
			calls = append(calls, slotRenewCall{cmd: scripts.EvalSha(ctx, scripts.SlotRenew(), []string{key}, args...),
				slots: slots[:n], shard: shard, before: before})
			slots = slots[n:]
		}
	}
	return calls
}

// renewed reads one renewal call's answer: {re-asserted, master_replid, master_replid2, the
// ids lost...}. Slots it re-asserted on a node that changed keep their requests running, but
// the node may lack the other replicas' slots: new slots wait for them (slotNodeChanged).
func (l *Limiter) renewed(c slotRenewCall, start time.Time) error {
	out, err := c.cmd.Slice()
	if err == nil && len(out) < 3 {
		err = fmt.Errorf("%w: slot renewal answered %d values", errBadReply, len(out))
	}
	if err != nil {
		return err
	}
	id, _ := out[1].(string)
	id2, _ := out[2].(string)
	if id == "" {
		return fmt.Errorf("%w: slot renewal answered no replication ID", errBadReply)
	}
	l.slotLineages.observe(c.shard, c.before, id, id2, func() {
		l.slotStats.nodeChanges.Add(1)
		l.fenceSlots(time.Now())
	})
	if n, ok := out[0].(int64); ok && n > 0 {
		l.slotStats.reasserted.Add(uint64(n))
	}
	gone := make(map[string]bool, len(out)-3)
	for _, v := range out[3:] {
		if s, ok := v.(string); ok {
			gone[s] = true
		}
	}
	ttl := l.opts.SlotExpiry
	for _, s := range c.slots {
		if gone[s.id] {
			l.loseSlot(s)
			continue
		}
		s.deadline.Store(start.Add(ttl).UnixNano())
	}
	return nil
}

// settled records a complete renewal that began at marks; after one that followed a failure,
// new slots wait SlotExpiry/2 for the other replicas to re-assert theirs (see the top of this
// file). A suspicion raised while it ran stays.
func (l *Limiter) settled(suspect bool, marks uint64) {
	if suspect {
		l.fenceSlots(time.Now())
	}
	for {
		cur := l.slotCleared.Load()
		if cur >= marks || l.slotCleared.CompareAndSwap(cur, marks) {
			return
		}
	}
}
