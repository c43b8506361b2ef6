package limiter

import (
	"crypto/rand"
	"encoding/base64"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/calendar"
)

// Shares let the replicas restore what a Redis lost.
//
// Redis replicates asynchronously: a replica promoted after its master died (Sentinel, a
// Cluster failover), or a Redis restarted without persistence, lacks the last writes, and
// counts lost there would be admitted a second time. Every replica knows what it was granted
// (leased units and single admissions alike) per key and window; the scripts keep that, as the
// replica's own field in the window state, beside the count (see scripts/lua/shares_open.lua). Each
// call carries what this replica knows of its shares of the current window and the one before,
// and the script first raises the state to them: the count by what this Redis lacks of them,
// never more. Repeating it adds nothing, and a count partly replicated is repaired exactly.
//
// A key the replica calls for is repaired with that call. The others are repaired by a
// re-assertion of every live share (Limiter.Reassert: one call per key, pipelined), which the
// limiter starts itself when a reply shows a loss or when Redis answers again after failing, and
// which the sidecar starts when another replica saw a loss (its heartbeat says so).
//
// The table is bounded: at most size keys, and a key whose windows have both ended frees its
// slot. A grant to a key beyond the bound keeps no share, and is counted as such (Stats): those
// units cannot be restored.
type shares struct {
	id   string
	hold time.Duration // how long grants wait in a state where a share was restored
	// idArg, holdArg and noHold are id, hold's milliseconds and 0 boxed once for the script
	// arguments, which every call to Redis appends.
	idArg, holdArg, noHold any
	size                   int64
	n                      atomic.Int64
	seed                   maphash.Seed
	shards                 [shareShards]shareShard
	// holds are the open holds the shares count (see holdtable.go); now is the local clock
	// they are due by.
	holds *holdTable
	now   func() time.Time
	// lowerings counts the lowerings of any share that Redis is told of (a settle, a give-back
	// or a lease's return giving units back), each made under its key's lock, so that a call's
	// stamp (known) orders it against them (see shares_open.lua). It starts at 1: a call read
	// before a replica's first lowering is stamped too, and a call stamped 0 (none) reads no
	// stamp, which would let it take that lowering for a loss.
	lowerings atomic.Int64
}

const shareShards = 32

type shareShard struct {
	mu sync.Mutex
	m  map[string]*share
}

// share is this replica's grants to one key in its last two windows.
type share struct {
	window    time.Duration
	alg       Algorithm
	policy    string // its limit's Policy, for OnRestore
	hold      int64  // ARGV[10] of its calls
	start     int64  // ms on Redis's clock
	cur, prev int64  // units granted in the window starting at start, and in the one before
	// cal is a calendar window's, whose share is of one period: start, window long (see
	// calendar_shares.go).
	cal *calendar.Calendar
}

// NewReplicaID returns a random id for Options.ReplicaID: 8 characters, short because every
// window state of a key this replica is granted in holds it.
func NewReplicaID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func newShares(id string, size int, hold time.Duration, maxHolds int, now func() time.Time) *shares {
	s := &shares{id: id, size: int64(size), hold: hold, seed: maphash.MakeSeed(), idArg: id, holdArg: hold.Milliseconds(), noHold: int64(0),
		holds: newHoldTable(maxHolds), now: now}
	s.lowerings.Store(1)
	for i := range s.shards {
		s.shards[i].m = map[string]*share{}
	}
	return s
}

func (s *shares) shard(key string) *shareShard {
	return &s.shards[maphash.String(s.seed, key)%shareShards]
}

// known returns what this replica knows it was granted of key: units in the window starting at
// start (ms), and in the one before, and the stamp lv of that knowledge: the lowerings so far,
// from 1 (see shares_open.lua).
func (s *shares) known(key string) (start, cur, prev, lv int64) {
	s.lapse()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lv = s.lowerings.Load()
	if e, ok := sh.m[key]; ok {
		return e.start, e.cur, e.prev, lv
	}
	return 0, 0, 0, lv
}

// knownBefore is known as it was before a lowering of lowered units in the window starting at
// start: what a call that makes that lowering in Redis says it knew (the script restores
// first, then lowers).
func (s *shares) knownBefore(key string, window time.Duration, start, lowered int64) (from, cur, prev, lv int64) {
	from, cur, prev, lv = s.known(key)
	switch {
	case from == start:
		cur += lowered
	case from == start+window.Milliseconds():
		prev += lowered
	}
	return from, cur, prev, lv
}

// lower takes units from key's share in the window starting at start, for a lowering Redis
// will be told of with the stamp known reads after it (see shares_open.lua). It returns what
// it took: less than units where the share held less, 0 where it holds nothing of that window
// (what a caller adds back of a lowering Redis did not make is never more than this).
func (s *shares) lower(key string, window time.Duration, start, units int64) int64 {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.lowerings.Add(1)
	e, ok := sh.m[key]
	if !ok || e.window != window {
		return 0
	}
	var took int64
	switch {
	case e.start == start:
		took = min(e.cur, units)
		e.cur -= took
	case e.start == start+window.Milliseconds():
		took = min(e.prev, units)
		e.prev -= took
	}
	return max(took, 0)
}

// add records units (negative: given back) granted to key, of a limit of alg and policy, in the
// window starting at start. It returns false when the table had no room for the key: those
// units keep no share.
func (s *shares) add(key string, alg Algorithm, policy string, window time.Duration, hold, start, units int64) bool {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok {
		if units <= 0 {
			return true
		}
		if s.n.Load() >= s.size {
			return false
		}
		s.n.Add(1)
		e = &share{}
		sh.m[key] = e
	}
	w := window.Milliseconds()
	switch {
	case e.window != window || e.start == 0:
		e.window, e.start, e.cur, e.prev = window, start, 0, 0
	case start == e.start:
	case start == e.start+w:
		e.start, e.cur, e.prev = start, 0, e.cur
	case start > e.start:
		e.start, e.cur, e.prev = start, 0, 0
	case start == e.start-w:
		// A late answer for the window before.
		e.prev = max(e.prev+units, 0)
		return true
	default:
		return true // older still: its window is over
	}
	if alg != "" {
		e.alg, e.policy, e.hold = alg, policy, hold
	}
	e.cur = max(e.cur+units, 0)
	return true
}

// holdFor is how long (ms) grants wait in a state of limit where a share had to be restored: the
// shares' hold, except for a limit that fails open, where a decision that waits is admitted
// uncounted, which would admit more than the missing shares it protects.
func (s *shares) holdFor(limit Limit) (int64, any) {
	if limit.FailureMode == FailureModeOpen {
		return 0, s.noHold
	}
	return s.hold.Milliseconds(), s.holdArg
}

// sweep frees the keys whose last two windows (a calendar's: its period) have ended by nowMS
// (Redis's clock).
func (s *shares) sweep(nowMS int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.ended(nowMS) {
				delete(sh.m, k)
				s.n.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// liveShare is one key's shares, for a re-assertion.
type liveShare struct {
	key       string
	alg       Algorithm
	policy    string
	hold      int64
	window    time.Duration
	start     int64
	cur, prev int64
	lv        int64
	cal       *calendar.Calendar
}

// live lists every key with a share in a window not ended by nowMS.
func (s *shares) live(nowMS int64) []liveShare {
	s.lapse()
	var out []liveShare
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if !e.ended(nowMS) && (e.cur > 0 || e.prev > 0) {
				out = append(out, liveShare{key: k, alg: e.alg, policy: e.policy, hold: e.hold, window: e.window, start: e.start, cur: e.cur, prev: e.prev, lv: s.lowerings.Load(), cal: e.cal})
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// lapse takes the holds whose deadline has passed out of the table of open holds. Their units
// stay in the shares: Redis keeps them counted, spent, until their window ends (a hold nobody
// settled counts as spent, see hold.go), and a failover restores them like any grant.
func (s *shares) lapse() {
	s.holds.due(s.now())
}
