// Package scripts holds the Lua scripts Redline runs in Redis and the one way they are run:
// EVALSHA, and on NOSCRIPT (Redis restarted, failed over, or SCRIPT FLUSH) SCRIPT LOAD and one
// retry (see Exec). It also loads the limiter's scripts on every master of a cluster and checks
// them there, for the manager. It knows nothing of Kubernetes nor of what the scripts decide.
package scripts

import (
	"context"
	"crypto/sha1" //nolint:gosec // SHA1 is what Redis uses to name scripts, not a security boundary.
	"embed"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Script is a Lua source and the SHA1 under which Redis stores it.
type Script struct {
	// Name says what the script is for; the limiter's scripts are named after their algorithm.
	Name   string
	Source string
	SHA    string
}

// New returns the script of source under name.
func New(name, source string) Script {
	sum := sha1.Sum([]byte(source)) //nolint:gosec // see import.
	return Script{Name: name, Source: source, SHA: hex.EncodeToString(sum[:])}
}

//go:embed lua/*.lua
var luaFS embed.FS

// limiterFiles names the limiter's scripts, one per algorithm, in the limiter's order.
var limiterFiles = []struct{ name, file string }{
	{"FixedWindow", "lua/fixed_window.lua"},
	{"SlidingWindowLog", "lua/sliding_window_log.lua"},
	{"SlidingWindowCounter", "lua/sliding_window_counter.lua"},
	{"TokenBucket", "lua/token_bucket.lua"},
}

// includeLine is how a script includes a fragment of lua/ in its place: the shares' opening and
// closing (lua/shares_open.lua, lua/shares_close.lua), written inline in the scripts of the window
// state that FixedWindow and SlidingWindowCounter share, and in the lease return. Inline, not
// as Lua functions: a script's local functions are closures made again on every call.
const includeLine = "--!include "

// source reads an embedded script with its fragments included. A fragment does not include.
func source(file string) string {
	src, err := luaFS.ReadFile(file)
	if err != nil {
		panic(fmt.Sprintf("embedded script %s missing: %v", file, err))
	}
	var b strings.Builder
	for line := range strings.SplitAfterSeq(string(src), "\n") {
		name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), includeLine)
		if !ok {
			b.WriteString(line)
			continue
		}
		frag, err := luaFS.ReadFile("lua/" + name)
		if err != nil || strings.Contains(string(frag), includeLine) {
			panic(fmt.Sprintf("script %s includes %q: not a fragment of lua/ (%v)", file, name, err))
		}
		b.Write(frag)
	}
	return b.String()
}

var limiterScripts = sync.OnceValue(func() []Script {
	out := make([]Script, 0, len(limiterFiles))
	for _, f := range limiterFiles {
		out = append(out, New(f.name, source(f.file)))
	}
	return out
})

// LeaseReturn gives the unused units of a lease back to the FixedWindow or SlidingWindowCounter
// window they were counted in (see lua/lease_return.lua). It is not an algorithm: Exec loads it
// on NOSCRIPT like the others, and the manager does not record it.
var LeaseReturn = sync.OnceValue(func() Script { return New("LeaseReturn", source("lua/lease_return.lua")) })

// TokenReturn gives back tokens a TokenBucket decision took, and LogReturn a member a
// SlidingWindowLog decision added, for a request another rule refused (see
// lua/token_return.lua, lua/log_return.lua); LeaseReturn does it for the window state of
// FixedWindow and SlidingWindowCounter. Like LeaseReturn, loaded by Exec on NOSCRIPT and by
// the manager with every sidecar script, and not recorded.
var (
	TokenReturn = sync.OnceValue(func() Script { return New("TokenReturn", source("lua/token_return.lua")) })
	LogReturn   = sync.OnceValue(func() Script { return New("LogReturn", source("lua/log_return.lua")) })
)

// HoldSettle settles a hold of FixedWindow or SlidingWindowCounter, HoldSettleTokenBucket one
// of TokenBucket and HoldSettleSlidingWindowLog one of SlidingWindowLog (see lua/hold_settle.lua,
// lua/hold_settle_tb.lua, lua/hold_settle_swl.lua). Holds are reserved by the algorithms' own
// scripts; like LeaseReturn, these are loaded by Exec on NOSCRIPT and by the manager with every
// sidecar script, and not recorded.
var (
	HoldSettle                 = sync.OnceValue(func() Script { return New("HoldSettle", source("lua/hold_settle.lua")) })
	HoldSettleTokenBucket      = sync.OnceValue(func() Script { return New("HoldSettleTokenBucket", source("lua/hold_settle_tb.lua")) })
	HoldSettleSlidingWindowLog = sync.OnceValue(func() Script {
		return New("HoldSettleSlidingWindowLog", source("lua/hold_settle_swl.lua"))
	})
)

// CalendarWindow decides a FixedWindow whose periods are calendar days, weeks or months, and
// CalendarReturn gives units back to one of its periods (see lua/calendar_window.lua,
// lua/calendar_return.lua). Not algorithms: a calendar window is a FixedWindow, and the
// document's script map stays as older sidecars read it. Like LeaseReturn, loaded by Exec on
// NOSCRIPT and by the manager with every sidecar script, and not recorded.
var (
	CalendarWindow = sync.OnceValue(func() Script { return New("CalendarWindow", source("lua/calendar_window.lua")) })
	CalendarReturn = sync.OnceValue(func() Script { return New("CalendarReturn", source("lua/calendar_return.lua")) })
)

// CalendarReserve takes a hold on a calendar window and CalendarSettle settles it, or charges
// one (see lua/calendar_reserve.lua, lua/calendar_settle.lua): a calendar window's token budget.
// Loaded like CalendarWindow.
var (
	CalendarReserve = sync.OnceValue(func() Script { return New("CalendarReserve", source("lua/calendar_reserve.lua")) })
	CalendarSettle  = sync.OnceValue(func() Script { return New("CalendarSettle", source("lua/calendar_settle.lua")) })
)

// SlotAcquire takes a slot of an in-flight limit and SlotRenew renews a replica's slots of one
// key (see lua/slot_acquire.lua, lua/slot_renew.lua). A slot is given back with a plain ZREM.
// Like LeaseReturn, loaded by Exec on NOSCRIPT and by the manager with every sidecar script,
// and not recorded.
var (
	SlotAcquire = sync.OnceValue(func() Script { return New("SlotAcquire", source("lua/slot_acquire.lua")) })
	SlotRenew   = sync.OnceValue(func() Script { return New("SlotRenew", source("lua/slot_renew.lua")) })
)

// peekFiles names the dry-run twin of each algorithm's script: what a plain decision would
// answer, read on Redis's clock from the same key, writing nothing (see lua/peek_*.lua).
var peekFiles = []struct{ name, file string }{
	{"FixedWindow", "lua/peek_fixed_window.lua"},
	{"SlidingWindowLog", "lua/peek_sliding_window_log.lua"},
	{"SlidingWindowCounter", "lua/peek_sliding_window_counter.lua"},
	{"TokenBucket", "lua/peek_token_bucket.lua"},
}

var peekScripts = sync.OnceValue(func() []Script {
	out := make([]Script, 0, len(peekFiles)+1)
	for _, f := range peekFiles {
		out = append(out, New("Peek"+f.name, source(f.file)))
	}
	return append(out, PeekCalendarWindow())
})

// PeekCalendarWindow is the dry-run twin of CalendarWindow (lua/peek_calendar_window.lua).
var PeekCalendarWindow = sync.OnceValue(func() Script {
	return New("PeekCalendarWindow", source("lua/peek_calendar_window.lua"))
})

// Peeks returns the dry-run twins of the limiter's scripts, in All's order. Like LeaseReturn,
// they are loaded by Exec on NOSCRIPT and by the manager with every sidecar script, and not
// recorded.
func Peeks() []Script { return slices.Clone(peekScripts()) }

// PeekFor returns the dry-run twin of the script of algorithm name.
func PeekFor(name string) (Script, bool) {
	for _, s := range peekScripts() {
		if s.Name == "Peek"+name {
			return s, true
		}
	}
	return Script{}, false
}

// All returns the limiter's scripts, one per algorithm, in a stable order.
func All() []Script { return slices.Clone(limiterScripts()) }

// For returns the limiter's script named name (an algorithm).
func For(name string) (Script, bool) {
	for _, s := range limiterScripts() {
		if s.Name == name {
			return s, true
		}
	}
	return Script{}, false
}

// SHAs returns the SHA of each of the limiter's scripts by name.
func SHAs() map[string]string {
	out := make(map[string]string, len(limiterFiles))
	for _, s := range limiterScripts() {
		out[s.Name] = s.SHA
	}
	return out
}

// forEachNode runs fn on every master of a cluster, or on the single server otherwise.
// Scripts are per node in Redis Cluster, so loading on one master is not enough.
func forEachNode(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := fn(ctx, node); err != nil {
				return fmt.Errorf("on %s: %w", node.Options().Addr, err)
			}
			return nil
		})
	}
	return fn(ctx, c)
}

// Load loads the limiter's scripts into Redis (every master of a cluster) with SCRIPT LOAD and
// returns their SHAs by name. It fails if Redis names a script differently than expected.
func Load(ctx context.Context, c redis.UniversalClient) (map[string]string, error) {
	err := forEachNode(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		for _, s := range limiterScripts() {
			sha, err := node.ScriptLoad(ctx, s.Source).Result()
			if err != nil {
				return fmt.Errorf("loading script %s: %w", s.Name, err)
			}
			if sha != s.SHA {
				return fmt.Errorf("loading script %s: redis returned sha %s, expected %s", s.Name, sha, s.SHA)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return SHAs(), nil
}

// Missing asks every node with SCRIPT EXISTS and returns the names of the limiter's scripts
// absent on at least one of them, sorted. An empty result means every script is loaded everywhere.
func Missing(ctx context.Context, c redis.UniversalClient) ([]string, error) {
	all := limiterScripts()
	shas := make([]string, len(all))
	for i, s := range all {
		shas[i] = s.SHA
	}
	var mu sync.Mutex
	missing := map[string]bool{}
	err := forEachNode(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		exists, err := node.ScriptExists(ctx, shas...).Result()
		if err != nil {
			return fmt.Errorf("checking scripts: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, ok := range exists {
			if !ok {
				missing[all[i].Name] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(missing))
	for name := range missing {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}
