package limiter

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

// Algorithm names a rate limiting algorithm. The values match the API's enum.
type Algorithm string

// The algorithms Redline implements, one Lua script each.
const (
	FixedWindow          Algorithm = "FixedWindow"
	SlidingWindowLog     Algorithm = "SlidingWindowLog"
	SlidingWindowCounter Algorithm = "SlidingWindowCounter"
	TokenBucket          Algorithm = "TokenBucket"
)

// Algorithms lists every algorithm in a stable order.
var Algorithms = []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket}

//go:embed lua/*.lua
var luaFS embed.FS

var scriptFiles = map[Algorithm]string{
	FixedWindow:          "lua/fixed_window.lua",
	SlidingWindowLog:     "lua/sliding_window_log.lua",
	SlidingWindowCounter: "lua/sliding_window_counter.lua",
	TokenBucket:          "lua/token_bucket.lua",
}

// Script is one algorithm's Lua source and the SHA1 under which Redis stores it.
type Script struct {
	Algorithm Algorithm
	Source    string
	SHA       string
}

var (
	scriptsOnce sync.Once
	scripts     map[Algorithm]Script
)

func loadEmbedded() {
	scripts = make(map[Algorithm]Script, len(scriptFiles))
	for alg, file := range scriptFiles {
		src, err := luaFS.ReadFile(file)
		if err != nil {
			panic(fmt.Sprintf("embedded script %s missing: %v", file, err))
		}
		sum := sha1.Sum(src) //nolint:gosec // see import.
		scripts[alg] = Script{Algorithm: alg, Source: string(src), SHA: hex.EncodeToString(sum[:])}
	}
}

// ScriptFor returns the script of an algorithm.
func ScriptFor(a Algorithm) (Script, bool) {
	scriptsOnce.Do(loadEmbedded)
	s, ok := scripts[a]
	return s, ok
}

// Scripts returns every script, ordered like Algorithms.
func Scripts() []Script {
	scriptsOnce.Do(loadEmbedded)
	out := make([]Script, 0, len(Algorithms))
	for _, a := range Algorithms {
		out = append(out, scripts[a])
	}
	return out
}

// ScriptSHAs returns the SHA of every script by algorithm.
func ScriptSHAs() map[Algorithm]string {
	out := make(map[Algorithm]string, len(Algorithms))
	for _, s := range Scripts() {
		out[s.Algorithm] = s.SHA
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

// LoadScripts loads every script into Redis (every master of a cluster) with SCRIPT LOAD and
// returns their SHAs by algorithm. It fails if Redis names a script differently than expected.
func LoadScripts(ctx context.Context, c redis.UniversalClient) (map[Algorithm]string, error) {
	err := forEachNode(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		for _, s := range Scripts() {
			sha, err := node.ScriptLoad(ctx, s.Source).Result()
			if err != nil {
				return fmt.Errorf("loading script %s: %w", s.Algorithm, err)
			}
			if sha != s.SHA {
				return fmt.Errorf("loading script %s: redis returned sha %s, expected %s", s.Algorithm, sha, s.SHA)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ScriptSHAs(), nil
}

// MissingScripts asks every node with SCRIPT EXISTS and returns the algorithms whose script is
// absent on at least one of them, sorted. An empty result means every script is loaded everywhere.
func MissingScripts(ctx context.Context, c redis.UniversalClient) ([]Algorithm, error) {
	all := Scripts()
	shas := make([]string, len(all))
	for i, s := range all {
		shas[i] = s.SHA
	}
	var mu sync.Mutex
	missing := map[Algorithm]bool{}
	err := forEachNode(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		exists, err := node.ScriptExists(ctx, shas...).Result()
		if err != nil {
			return fmt.Errorf("checking scripts: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, ok := range exists {
			if !ok {
				missing[all[i].Algorithm] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Algorithm, 0, len(missing))
	for a := range missing {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Algorithm) int { return strings.Compare(string(a), string(b)) })
	return out, nil
}
