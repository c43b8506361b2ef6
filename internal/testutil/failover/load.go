package failover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
)

// Cell is one failover of one fleet: what the window admitted per rule, and how long the
// switch took.
type Cell struct {
	Scenario string
	// Auth is how the sidecars reached Redis: their namespace's user under the manager, or
	// the default user (the control).
	Auth     Auth
	Sidecars int
	Leases   bool
	// Switch is from the kill until Redis had a master again: every sentinel names the
	// promoted replica, the cluster's replica answers ROLE master, the restarted server PING.
	Switch time.Duration
	// Decided is from the kill until every sidecar had decided from Redis again (on ProbeRule,
	// keys never used before, which have nothing to restore and so no hold); 0 if one never did.
	Decided time.Duration
	// ClosedBySidecar is, for each sidecar, from the kill until the last decision its failure
	// mode made for any rule (0: none after the kill).
	ClosedBySidecar []time.Duration
	// AfterKill is, for each sidecar, its decisions after the kill in slices of Slice: how
	// many, and how many the failure mode made (DegradedShare reads them).
	AfterKill [][]SliceCount
	// RestoredIn is from the kill until every sidecar's redline_sidecar_restored_units_total
	// had risen (measured by the restart cell only; 0 elsewhere).
	RestoredIn time.Duration
	// Restored and Regressions are each sidecar's redline_sidecar_restored_units_total and
	// redline_sidecar_counter_regressions_total at the end of the window (0 for a sidecar
	// without them, such as one built before issue 20).
	Restored, Regressions []float64
	Rules                 []RuleResult
}

// RuleResult is one rule's window in a cell.
type RuleResult struct {
	Rule
	// AtCut and AtKill are the rule's admitted count (over its keys) when the replica was cut
	// off and when the master was killed; Admitted is the window's total.
	AtCut, AtKill, Admitted int64
	// MaxKey and MinKey are the most and the least one key admitted in the window.
	MaxKey, MinKey int64
	// OverKeys counts keys that admitted more than the limit; ShortKeys keys that admitted
	// less than 95% of it though their demand exceeded it.
	OverKeys, ShortKeys int
	// Demand is how many checks asked for the rule.
	Demand int64
	// Degraded counts decisions the failure mode (Closed: refuse) made instead of Redis.
	Degraded int64
	// Closed is from the kill until the last decision the failure mode made for this rule.
	Closed time.Duration
}

// Slice is the length of one AfterKill slice.
const Slice = 100 * time.Millisecond

// SliceCount is one sidecar's decisions in one Slice after the kill.
type SliceCount struct{ Decisions, Degraded int64 }

// DegradedShare is the share of sidecar s's decisions from `from` after the kill to the end of
// the demand that its failure mode made, and how long that stretch was (0, 0 when the demand
// ended before from). A failure mode that goes on deciding after Redis is back decides most
// of them; a stray timeout on a loaded machine (the chart's 50ms Redis timeout) a few.
func (c *Cell) DegradedShare(s int, from time.Duration) (float64, time.Duration) {
	var n, d int64
	var last int
	for i, sc := range c.AfterKill[s] {
		if time.Duration(i)*Slice < from || sc.Decisions == 0 {
			continue
		}
		n, d, last = n+sc.Decisions, d+sc.Degraded, i
	}
	if n == 0 {
		return 0, 0
	}
	return float64(d) / float64(n), time.Duration(last+1)*Slice - from
}

// load is the demand of one window: Concurrency callers, round-robin over the fleet's
// sidecars, the cell's rules and each rule's keys, counting every decision by key.
type load struct {
	e        *Env
	f        *Fleet
	rules    []int            // indexes into e.o.Rules
	slots    []int            // indexes into rules, each rule as often as its weight
	hotKeys  []string         // by rule (of rules): the key value of a one-key rule
	admitted [][]atomic.Int64 // by rule (of rules), by key
	demand   [][]atomic.Int64
	degraded []atomic.Int64
	closedNs []atomic.Int64 // by rule (of rules): ns from the kill to the failure mode's last decision
	closedBy []atomic.Int64 // the same by sidecar
	// afterKill is by sidecar, by Slice after the kill: decisions and those of the failure mode.
	afterKill [][][2]atomic.Int64
	killedAt  atomic.Int64 // unix ns of the kill, 0 before
	next      atomic.Int64
	keyNext   []atomic.Int64 // by rule (of rules)

	probeKeys []string
	probeNext atomic.Int64
	decided   []atomic.Int64 // by sidecar: ns from the kill to its first Redis decision, 0 before
	probes    sync.WaitGroup

	errOnce sync.Once
	err     error
	stop    context.CancelFunc
}

func (e *Env) newLoad(f *Fleet, rules []int, hotKeys map[string]string, probeKeys []string) *load {
	l := &load{e: e, f: f, rules: rules, hotKeys: make([]string, len(rules)), probeKeys: probeKeys,
		admitted: make([][]atomic.Int64, len(rules)), demand: make([][]atomic.Int64, len(rules)),
		degraded: make([]atomic.Int64, len(rules)), closedNs: make([]atomic.Int64, len(rules)),
		decided: make([]atomic.Int64, len(f.Checks)), closedBy: make([]atomic.Int64, len(f.Checks)),
		keyNext: make([]atomic.Int64, len(rules)), afterKill: make([][][2]atomic.Int64, len(f.Checks))}
	for s := range l.afterKill {
		// The demand never runs past the window (or Tail past the drive, within the cell's
		// own bound of two windows and a margin).
		l.afterKill[s] = make([][2]atomic.Int64, (2*e.o.Window+90*time.Second)/Slice)
	}
	for i, ri := range rules {
		l.admitted[i] = make([]atomic.Int64, e.o.Rules[ri].Keys)
		l.demand[i] = make([]atomic.Int64, e.o.Rules[ri].Keys)
		for range max(e.o.Rules[ri].Weight, 1) {
			l.slots = append(l.slots, i)
		}
		l.hotKeys[i] = HotKey
		if v, ok := hotKeys[e.o.Rules[ri].Name]; ok {
			l.hotKeys[i] = v
		}
	}
	return l
}

func (l *load) fail(err error) {
	l.errOnce.Do(func() { l.err = err; l.stop() })
}

// run calls until ctx ends; it returns when every caller has (the probes markKill starts are
// waited for by runWindow once the drive has returned, so that none starts after the wait).
func (l *load) run(ctx context.Context) {
	var wg sync.WaitGroup
	n := int64(len(l.f.Checks))
	for range l.e.o.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := l.next.Add(1)
				s, rest := i%n, i/n
				ri := l.slots[rest%int64(len(l.slots))]
				r := l.e.o.Rules[l.rules[ri]]
				// Each rule goes round its keys on its own count, so that every key's demand
				// is spread over the whole window, not spent in one burst.
				k := int((l.keyNext[ri].Add(1) - 1) % int64(r.Keys))
				key := l.hotKeys[ri]
				if r.Keys > 1 {
					key = "k" + strconv.Itoa(k)
				}
				resp, err := l.e.check(ctx, l.f.Checks[s], r.Name, key)
				if err != nil {
					if ctx.Err() == nil {
						l.fail(err)
					}
					return
				}
				l.record(int(s), ri, k, resp)
			}
		})
	}
	wg.Wait()
}

// record counts one decision of sidecar s for rule ri (of l.rules) on key k.
func (l *load) record(s, ri, k int, r checkapi.Response) {
	l.demand[ri][k].Add(1)
	if r.Allowed {
		l.admitted[ri][k].Add(1)
	}
	degraded := len(r.Results) > 0
	if degraded {
		switch r.Results[0].Source {
		case "redis", "precheck", "lease":
			degraded = false
		}
	}
	if degraded {
		l.degraded[ri].Add(1)
	}
	killedAt := l.killedAt.Load()
	if killedAt == 0 {
		return
	}
	d := time.Now().UnixNano() - killedAt
	if i := d / int64(Slice); i < int64(len(l.afterKill[s])) {
		l.afterKill[s][i][0].Add(1)
		if degraded {
			l.afterKill[s][i][1].Add(1)
		}
	}
	if !degraded {
		return
	}
	// The last decision the failure mode made after the kill is when the last sidecar stopped
	// refusing.
	raise(&l.closedNs[ri], d)
	raise(&l.closedBy[s], d)
}

// raise sets v to d if d is larger.
func raise(v *atomic.Int64, d int64) {
	for {
		old := v.Load()
		if d <= old || v.CompareAndSwap(old, d) {
			return
		}
	}
}

// total is rule ri's (of l.rules) admitted count over its keys.
func (l *load) total(ri int) int64 {
	var n int64
	for k := range l.admitted[ri] {
		n += l.admitted[ri][k].Load()
	}
	return n
}

// minHot is the least fraction of its limit any one-key rule of the cell has admitted (1 when
// the cell has none).
func (l *load) minHot() float64 {
	m := 1.0
	for i, ri := range l.rules {
		if r := l.e.o.Rules[ri]; r.Keys == 1 {
			m = min(m, float64(l.total(i))/float64(r.Limit))
		}
	}
	return m
}

// waitHot waits until every one-key rule has admitted frac of its limit.
func (l *load) waitHot(ctx context.Context, frac float64) error {
	for l.minHot() < frac {
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for %.0f%% of the hot limits admitted (at %.0f%%): %w", 100*frac, 100*l.minHot(), err)
		}
	}
	return nil
}

func (l *load) totals() []int64 {
	out := make([]int64, len(l.rules))
	for i := range l.rules {
		out[i] = l.total(i)
	}
	return out
}

// markKill records the kill's time and starts asking every sidecar for ProbeRule on fresh keys
// every 25ms until it decides from Redis.
func (l *load) markKill(ctx context.Context) {
	killed := time.Now()
	l.killedAt.Store(killed.UnixNano())
	for s, addr := range l.f.Checks {
		l.probes.Go(func() {
			for ctx.Err() == nil {
				i := l.probeNext.Add(1)
				key := l.probeKeys[int(i)%len(l.probeKeys)]
				r, err := l.e.check(ctx, addr, ProbeRule, key)
				if err == nil && len(r.Results) > 0 && r.Results[0].Source == "redis" {
					l.decided[s].Store(int64(max(time.Since(killed), 1)))
					return
				}
				if err != nil && ctx.Err() == nil {
					l.fail(err)
					return
				}
				_ = sleep(ctx, 25*time.Millisecond)
			}
		})
	}
}

// decidedAll is when the last sidecar decided from Redis again after the kill, 0 if one never did.
func (l *load) decidedAll() time.Duration {
	var m int64
	for i := range l.decided {
		d := l.decided[i].Load()
		if d == 0 {
			return 0
		}
		m = max(m, d)
	}
	return time.Duration(m)
}

// CellSpec is how a cell runs its window.
type CellSpec struct {
	Scenario string
	Auth     Auth
	// Rules names the rules the demand spends (every rule of the Env when empty).
	Rules []string
	// HotKeys are the key values of one-key rules by name (HotKey for those it does not name).
	HotKeys map[string]string
	// ProbeKeys are fresh key values for ProbeRule (generated when empty).
	ProbeKeys []string
	// Tail, when positive, ends the demand this long after the drive returns instead of just
	// before the window ends.
	Tail time.Duration
}

// drive runs the failover while the demand goes on and fills what it measured into c and
// the rules' AtCut and AtKill (by rule of the cell, from totals).
type drive func(ctx context.Context, l *load, c *Cell, atCut, atKill *[]int64) error

// runWindow waits for a window to begin, then sends demand through f until just before it ends
// (or Tail after d returns), running d meanwhile.
func (e *Env) runWindow(ctx context.Context, f *Fleet, spec CellSpec, d drive) (*Cell, error) {
	rules, err := e.cellRules(&spec)
	if err != nil {
		return nil, err
	}
	c := &Cell{Scenario: spec.Scenario, Auth: spec.Auth, Sidecars: len(f.Checks), Leases: f.Leases}
	// The whole measurement falls in one window: start just after one begins.
	w := e.o.Window
	if now := time.Now(); now.Sub(now.Truncate(w)) > 300*time.Millisecond {
		wait := time.Until(now.Truncate(w).Add(w + 150*time.Millisecond))
		e.o.Progress("%s, %d sidecars, leases %t: ready; waiting %s for the next window", spec.Scenario, c.Sidecars, f.Leases, wait.Round(100*time.Millisecond))
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	windowEnd := time.Now().Truncate(w).Add(w - 300*time.Millisecond)
	e.o.Progress("%s, %d sidecars, leases %t: load", spec.Scenario, c.Sidecars, f.Leases)
	l := e.newLoad(f, rules, spec.HotKeys, spec.ProbeKeys)
	lctx, stop := context.WithDeadline(ctx, windowEnd)
	defer stop()
	l.stop = stop
	done := make(chan struct{})
	go func() { l.run(lctx); close(done) }()
	atCut, atKill := make([]int64, len(rules)), make([]int64, len(rules))
	derr := d(lctx, l, c, &atCut, &atKill)
	if derr == nil && spec.Tail > 0 {
		_ = sleep(lctx, spec.Tail)
		stop()
	}
	if derr != nil {
		stop()
	}
	<-done
	l.probes.Wait()
	if l.err != nil {
		return nil, l.err
	}
	if derr != nil {
		if errors.Is(derr, context.DeadlineExceeded) {
			return nil, fmt.Errorf("the window ended before the failover completed: %w", derr)
		}
		return nil, derr
	}
	if err := e.measure(ctx, f, l, c, rules, atCut, atKill); err != nil {
		return nil, err
	}
	return c, nil
}

// cellRules are the indexes of spec's rules (every rule when it names none); it gives spec
// fresh probe keys when it has none.
func (e *Env) cellRules(spec *CellSpec) ([]int, error) {
	var rules []int
	if len(spec.Rules) == 0 {
		for i := range e.o.Rules {
			rules = append(rules, i)
		}
	}
	for _, name := range spec.Rules {
		i, ok := e.ruleIndex[name]
		if !ok {
			return nil, fmt.Errorf("failover: no rule %q", name)
		}
		rules = append(rules, i)
	}
	if len(spec.ProbeKeys) == 0 {
		for i := range 20_000 {
			spec.ProbeKeys = append(spec.ProbeKeys, fmt.Sprintf("probe-%d-%d", e.cellSeq, i))
		}
	}
	return rules, nil
}

// measure fills c with what the load l measured of rules and the sidecars' metrics.
func (e *Env) measure(ctx context.Context, f *Fleet, l *load, c *Cell, rules []int, atCut, atKill []int64) error {
	c.Decided = l.decidedAll()
	for i := range l.closedBy {
		c.ClosedBySidecar = append(c.ClosedBySidecar, time.Duration(l.closedBy[i].Load()))
		slices := make([]SliceCount, len(l.afterKill[i]))
		for j := range slices {
			slices[j] = SliceCount{Decisions: l.afterKill[i][j][0].Load(), Degraded: l.afterKill[i][j][1].Load()}
		}
		c.AfterKill = append(c.AfterKill, slices)
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	if c.Restored, err = e.Metric(mctx, f, "redline_sidecar_restored_units_total"); err != nil {
		return err
	}
	if c.Regressions, err = e.Metric(mctx, f, "redline_sidecar_counter_regressions_total"); err != nil {
		return err
	}
	for i, ri := range rules {
		r := RuleResult{Rule: e.o.Rules[ri], AtCut: atCut[i], AtKill: atKill[i], Admitted: l.total(i),
			Degraded: l.degraded[i].Load(), Closed: time.Duration(l.closedNs[i].Load()), MinKey: -1}
		for k := range l.admitted[i] {
			a, dem := l.admitted[i][k].Load(), l.demand[i][k].Load()
			r.Demand += dem
			r.MaxKey = max(r.MaxKey, a)
			if r.MinKey < 0 || a < r.MinKey {
				r.MinKey = a
			}
			if a > r.Limit {
				r.OverKeys++
			}
			if dem > r.Limit && a*100 < r.Limit*95 {
				r.ShortKeys++
			}
		}
		c.Rules = append(c.Rules, r)
	}
	return nil
}
