package limiter

import (
	"time"

	"github.com/redline-dev/redline/internal/calendar"
)

// The types a caller of the limiter builds and reads, in one place: what goes in (Options, a
// Limit, an Ask), what comes out (Result, Settled, SlotResult) and what the metrics read
// (Stats). The handles with state of their own (Limiter, Hold, Slot) stay beside their code.

// Options tune a Limiter: what the sidecar sets. The zero value gives working defaults.
type Options struct {
	// LeaseHorizon sizes leases: a key asks for what it admitted locally over about this long
	// (default 2s; negative turns leases off, every decision then asks Redis). A lease unused
	// for this long goes back. See lease.go.
	LeaseHorizon time.Duration
	// LeaseSize bounds the keys holding a lease (default 16384: about 400 bytes a key, twice
	// that with the garbage collector's headroom; the least recently used go back first).
	LeaseSize int
	// CallDeadline is how long after a pipeline leaves Redis may still run its scripts (default
	// none). A script that runs later counts nothing and answers "stale", which the failure mode
	// decides: its caller has stopped waiting (set it below the client's read timeout), and the
	// units it would count would be admitted by nobody. See clock.go.
	CallDeadline time.Duration
	// SlotExpiry is how long an in-flight slot counts without a renewal (default
	// DefaultSlotExpiry, 2s to 10m): the bound on how long a dead replica's slots stay taken.
	// See slots.go.
	SlotExpiry time.Duration
	// NodeChanges, when set, counts the times the client saw the Redis it speaks to change
	// without a failed call (redisconn.ConnStats.NodeChanges: a Cluster slot moved to another
	// node, a Sentinel master switched): the client follows such a change by itself, so a
	// command that succeeds may have run on a node lacking the last writes. In-flight slots
	// treat a change as they treat a failed call (see slots.go).
	NodeChanges func() uint64
	// ReplicaID names this replica's shares in Redis (see shares.go; NewReplicaID makes one).
	// Empty keeps none: counts a Redis loses in a failover or a restart stay lost.
	ReplicaID string
	// ShareKeys bounds the keys whose shares this replica keeps (default 65536: about 150 bytes
	// a key). A key whose two last windows have ended frees its slot; a grant to a key beyond
	// the bound keeps no share (Stats.UnkeptShareUnits).
	ShareKeys int
	// FallbackReplicas is what LocalFallback divides a limit by while Limit.Replicas is 0,
	// before any heartbeat of the limit's replicas has been heard: a replica that started
	// during a Redis outage would otherwise divide by 1 and admit the whole limit, as would
	// every other one started then. The caller gives the workload's largest replica count
	// (0: 1). Heard replicas win.
	FallbackReplicas int64
	// RestoreHold is how long grants of a key wait once a replica had to restore its share in
	// it (default none): the Redis lost counts, so other replicas' shares are likely missing
	// too, and a grant before they re-assert theirs admits them again. Set it above the time
	// the other replicas take to hear of the loss (the sidecar: twice its heartbeat interval).
	// Waiting decisions go to the failure mode; limits that fail open do not wait.
	RestoreHold time.Duration
	// OnRestore, when set, is told each time this replica's shares restored units that Redis
	// had lost, with the Policy of the limit they were granted under.
	OnRestore func(policy string, units int64)
	// MaxBatch is the most decisions sent in one pipeline (default 128). 1 disables batching,
	// as the benchmark does to measure what batching saves.
	MaxBatch int
	// PrecheckSize bounds the local cache of refused keys (default 65536 keys; negative
	// disables it, as the benchmark does to measure what it saves).
	PrecheckSize int

	// The knobs below keep their defaults in production; tests turn them (export_test.go).

	// maxDetached bounds the detached asks of AllowAll in flight at once (default 256): each
	// holds a goroutine past its request, so while Redis is slow to answer, a flood of requests
	// whose rules answer locally would otherwise leave one behind each. An ask beyond the bound
	// is decided with the others, its caller waiting for it.
	maxDetached int
	// breakerFailures is how many consecutive failed Redis round trips open the circuit
	// breaker (default 5). Each shard has its own: each master of a Redis Cluster, or the one
	// Redis otherwise (see breakers.go), and an open one sends its own keys to the failure mode.
	breakerFailures uint32
	// breakerOpenFor is how long a breaker stays open before it lets one probe through
	// (default 1s). FailureModeClosed refusals carry it as their retry-after.
	breakerOpenFor time.Duration
	// maxLease bounds the units of one lease (default 10000).
	maxLease int64
	// maxHolds bounds the open holds (Reserve) whose units this replica's shares count (default
	// 65536: about 100 bytes a hold). A hold beyond it keeps no share: a failover cannot
	// restore its units (Stats.UnkeptShareUnits), which nothing then re-asserts after it went
	// back either. See holdtable.go.
	maxHolds int
	// maxOpenHolds bounds the holds (Reserve) one key has open at once, in Redis, across every
	// replica (default defaultMaxOpenHolds): a reserve beyond it is refused like a limit's
	// refusal, with a RetryAfter. What a key's requests spend past their holds, known only at
	// their settles, is then at most that many requests' worth at once. A hold past its
	// deadline no longer counts toward it.
	maxOpenHolds int
	// now is the local clock, used only for the pre-check, the fallback limiters and leases'
	// local deadlines; decisions in Redis use Redis's clock (default time.Now).
	now func() time.Time
}

// Limit is one rate limit: at most Requests per Window, shaped by Algorithm.
type Limit struct {
	// Algorithm picks the script that decides.
	Algorithm Algorithm
	// Requests is how many units of cost fit in one Window.
	Requests int64
	// Window is the period Requests applies to. Whole milliseconds; at least 1ms.
	Window time.Duration
	// Burst is the bucket capacity of TokenBucket (0 means Requests). Other algorithms ignore it.
	Burst int64
	// FailureMode says what to decide while Redis cannot be asked. Empty means LocalFallback.
	FailureMode FailureMode
	// Shadow computes and counts the decision but always admits.
	Shadow bool
	// Replicas is the live replica count LocalFallback divides this limit by (0 counts as 1):
	// the count of the limit's heartbeat group, as Announce returns it.
	Replicas int64
	// Calendar, when set, makes a FixedWindow count calendar periods (days, weeks, months in a
	// time zone) instead of windows aligned on multiples of Window; Window is then the longest
	// a period can be (Calendar.MaxLength), which bounds what needs one length (see calendar.go).
	Calendar *calendar.Calendar
	// Peers is the most live replicas of the limit's group seen lately (0: unknown). A key
	// whose grants wait after a restore (Options.RestoreHold) decides again once that many
	// replicas re-asserted their shares in it, instead of at the end of the hold.
	Peers int64
	// Durability is what a grant of the limit waits for before it is answered (durability.go).
	Durability Durability
	// Policy names the policy the limit belongs to, for Options.OnRestore: what this replica's
	// shares restored is told by policy, not by key.
	Policy string
}

// Algorithm names a rate limiting algorithm. The values match the API's enum.
type Algorithm string

// The algorithms Redline implements, one Lua script each (see package scripts).
const (
	FixedWindow          Algorithm = "FixedWindow"
	SlidingWindowLog     Algorithm = "SlidingWindowLog"
	SlidingWindowCounter Algorithm = "SlidingWindowCounter"
	TokenBucket          Algorithm = "TokenBucket"
)

// Algorithms lists every algorithm in a stable order.
var Algorithms = []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket}

// FailureMode says how a limit decides while Redis is unreachable. The values match the API's enum.
type FailureMode string

// The failure modes.
const (
	// FailureModeOpen admits every request.
	FailureModeOpen FailureMode = "Open"
	// FailureModeClosed refuses every request, with a retry-after of the breaker's open period.
	FailureModeClosed FailureMode = "Closed"
	// FailureModeLocalFallback enforces Requests / live replicas per key in this process.
	FailureModeLocalFallback FailureMode = "LocalFallback"
)

// Durability is what a limit's grants wait for, and for how long at most.
type Durability struct {
	Mode    DurabilityMode
	Timeout time.Duration // whole milliseconds, at least 1ms; 0 with Mode empty
}

// DurabilityMode is what a grant waits for. The values match the API's enum.
type DurabilityMode string

// The durability modes; the zero value waits for nothing.
const (
	// DurabilityReplica waits for one replica to acknowledge (WAIT 1 <timeout>).
	DurabilityReplica DurabilityMode = "Replica"
	// DurabilityAppendOnlyFile waits for the master's fsynced append-only file (WAITAOF 1 0
	// <timeout>, Redis 7.2 or later).
	DurabilityAppendOnlyFile DurabilityMode = "AppendOnlyFile"
)

// InFlight is an in-flight limit.
type InFlight struct {
	// Max is the most requests of a key in progress at once, 1 to MaxInFlight.
	Max         int64
	FailureMode FailureMode
	// Shadow takes slots and reports a full key, but never refuses.
	Shadow bool
	// Replicas is the live replica count LocalFallback divides Max by (0: the limiter's
	// FallbackReplicas, then 1).
	Replicas int64
}

// Ask is one decision of AllowAll.
type Ask struct {
	Key   string
	Limit Limit
	Cost  int64
	// Detached asks are decided beside the others, their Redis calls in the same batch, but
	// AllowAll does not wait for them: a candidate limit must not hold up the request it
	// counts when the rule it shadows needs no round trip (a lease, the pre-check) and it
	// does. Each one's result goes to AllowAll's detached function once decided, perhaps after
	// AllowAll returned, and is not waited on by anyone else; its context is the caller's
	// without its cancellation (the call's own deadline bounds it).
	Detached bool
}

// Result is one decision.
type Result struct {
	// Allowed says whether to let the request through. Always true in shadow mode.
	Allowed bool
	// OverLimit says the limit refused the request (also in shadow mode, where it is let through).
	OverLimit bool
	// Remaining is how much cost the limit would still admit now.
	Remaining int64
	// RetryAfter is how long until the refused cost would be admitted: 0 when admitted, -1 when
	// the cost exceeds what the limit can ever admit.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to its full capacity.
	ResetAfter time.Duration
	// Period is the length of the calendar period Redis decided in (a 23-hour day, a 29-day
	// month), for a limit with a Calendar; 0 otherwise.
	Period time.Duration
	// Source says where the decision came from.
	Source Source
	// Err is why Redis was not asked or did not answer, for logs and metrics, when Source is one
	// of the failure sources. The decision is still valid.
	Err error

	spent spent // what an admission counted, for GiveBack (see Counted)
}

// Source says where a decision came from.
type Source uint8

// The sources of a decision.
const (
	// SourceRedis is a decision by the shared counter in Redis.
	SourceRedis Source = iota + 1
	// SourcePrecheck is a refusal from the local cache of refused keys, made without Redis.
	SourcePrecheck
	// SourceFallback is a decision by the local per-replica limiter while Redis is unreachable.
	SourceFallback
	// SourceFailOpen is an admission because Redis is unreachable and the limit fails open.
	SourceFailOpen
	// SourceFailClosed is a refusal because Redis is unreachable and the limit fails closed.
	SourceFailClosed
	// SourceCapacity is a refusal made without Redis because the cost exceeds what the limit
	// can ever admit.
	SourceCapacity
	// SourceLease is an admission from a lease this limiter holds: units Redis counted when it
	// granted them, admitted without a call.
	SourceLease
)

var sourceNames = [...]string{"unknown", "redis", "precheck", "fallback", "failopen", "failclosed", "capacity", "lease"}

// String returns the lower-case name used in metrics labels.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Refund is one admitted decision to undo: the key and limit it was decided under (not the
// rule's as it may be now: a reload may have changed it since) and its Result.
type Refund struct {
	Key    string
	Limit  Limit
	Result Result
}

// Settled is what a Settle did.
type Settled struct {
	// Returned is how many of the hold's units went back (it used fewer).
	Returned int64
	// Debt is how many units were used beyond the hold, in full (up to maxUsed): counted past
	// the limit, so its key is refused for as long as its algorithm carries a debt (see
	// holdAsk). The algorithm may count less of it than Debt says; never less than refuses the
	// key as long as the whole would.
	Debt int64
	// Expired says the hold's deadline had passed before the settle: its holder was taken for
	// dead and its units stayed spent, so the settle charged the same as before its deadline
	// (SlidingWindowLog gave nothing back: the unused units were in its log already).
	Expired bool
}

// SlotResult is what an Acquire decided.
type SlotResult struct {
	// Allowed says the request may proceed (with a slot, or by its failure mode or shadow).
	Allowed bool
	// Full says the key had Max requests in progress (the request would be refused).
	Full bool
	// InUse is how many slots of the key were taken after the call (as Redis counted them).
	InUse int64
	// RetryAfter is how long a refused request should wait: a slot may free at any time.
	RetryAfter time.Duration
	// Err is why Redis did not decide (the failure mode did), or ErrSlotsFull.
	Err error
}

// Stats are counters since the limiter was created, for metrics.
type Stats struct {
	// RedisDecisions were answered by a script in Redis.
	RedisDecisions uint64
	// PrecheckRefusals were refused locally without a Redis call.
	PrecheckRefusals uint64
	// LeaseDecisions were admitted locally from a lease, without a Redis call.
	LeaseDecisions uint64
	// LeaseGrants are Redis decisions that granted a lease of more than their own cost.
	LeaseGrants uint64
	// DegradedDecisions were made by a failure mode (open, closed or local fallback).
	DegradedDecisions uint64
	// Pipelines is the number of Redis round trips made for decisions, NOSCRIPT retries included.
	Pipelines uint64
	// ScriptLoads counts SCRIPT LOADs after NOSCRIPT.
	ScriptLoads uint64
	// StaleCalls reached Redis after their deadline and counted nothing (see CallDeadline).
	StaleCalls uint64
	// LeaseKeys is the number of keys in the lease table now (holding a lease, or about to).
	LeaseKeys int
	// ShareKeys is the number of keys this replica keeps shares of now.
	ShareKeys int
	// Restorations counts calls whose shares found Redis short of them (a failover or a
	// restart lost counts), and RestoredUnits the units they added back.
	Restorations, RestoredUnits uint64
	// Reassertions counts re-assertions of every live share, and ReassertErrors those that
	// could not reach every key (the next one retries).
	Reassertions, ReassertErrors uint64
	// HeldCalls counts decisions that waited for the replicas to restore their shares
	// (RestoreHold) and went to the failure mode.
	HeldCalls uint64
	// UnkeptShareUnits counts units granted to keys beyond ShareKeys: those keep no share, and
	// Redis losing them could not be repaired.
	UnkeptShareUnits uint64
	// HoldsOpen is the size of this replica's table of open holds now (see holdtable.go).
	HoldsOpen int
	// GivenBackUnits counts units GiveBack gave back (requests another rule refused), and
	// GiveBackErrors the give-backs that could not be made (their units stayed counted).
	GivenBackUnits, GiveBackErrors uint64
	// AckedGrants counts grants of a limit with Durability whose wait acknowledged them, and
	// Unacked those whose wait did not (they stand: see durability.go), by reason.
	AckedGrants uint64
	Unacked     UnackedGrants
	// BreakerOpen says the circuit breaker of some shard is open now.
	BreakerOpen bool
	// Shards are the circuit breakers, one per shard (see ShardState), by name.
	Shards []ShardState
}

// UnackedGrants counts grants whose wait did not acknowledge them, by reason.
type UnackedGrants struct {
	// Timeout: no acknowledgement within the timeout. Unsupported: the server does not know
	// WAITAOF (before Redis 7.2). Error: the server refused the wait or did not answer it.
	// Busy: sent without a wait, as many waits as the pool allows running already.
	Timeout, Unsupported, Error, Busy uint64
}

// Why a grant was not acknowledged, the label of Stats.Unacknowledged.
const (
	// UnackedTimeout: the timeout passed before the acknowledgement (a lagging or missing
	// replica, a slow disk).
	UnackedTimeout = "timeout"
	// UnackedUnsupported: the server does not know WAITAOF (before Redis 7.2).
	UnackedUnsupported = "unsupported"
	// UnackedError: the server refused the wait (appendonly off, ACL) or did not answer it.
	UnackedError = "error"
	// UnackedBusy: as many pipelines as waitConcurrency allows were waiting already; the grant
	// went without a wait rather than take a connection the other rules need.
	UnackedBusy = "busy"
)

// SlotStats counts what the in-flight slots did.
type SlotStats struct {
	// Held is how many slots this replica holds now.
	Held int
	// Renewals counts renewal rounds, RenewErrors the renewal calls that failed.
	Renewals, RenewErrors uint64
	// Lost counts slots lost before their release (expired in Redis, or not renewed in time).
	Lost uint64
	// ReleaseErrors counts releases that failed (their slot returned at its expiry).
	ReleaseErrors uint64
	// Reasserted counts slots a renewal added back: Redis no longer counted them (a failover,
	// a restart) and their key had room.
	Reasserted uint64
}

// ShardState is one shard's circuit breaker.
type ShardState struct {
	// Name is the shard: a Redis Cluster master's address; "all" without a cluster; "other"
	// for a cluster's keys of no known master (or beyond the bound on breakers).
	Name string
	// Open says its breaker is open: decisions of its keys go to the failure mode.
	Open bool
}
