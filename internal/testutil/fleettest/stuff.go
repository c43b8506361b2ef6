// Package fleettest writes heartbeat groups the way a tenant can with its own Redis user, to
// test what the manager reads of them.
package fleettest

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
)

// Stuffed is a namespace whose groups were written directly (ZADD, HSET), not by heartbeats.
type Stuffed struct {
	Client    redis.UniversalClient
	Namespace string
	Policies  []string
}

// template holds the members of every stuffed group of the namespace at score 1, so that a
// group is (re)scored at Redis's now by one ZUNIONSTORE with that weight, inside Redis.
func (s Stuffed) template() string { return fleet.KeyPrefix(s.Namespace) + "fleettest}" }

// Stuff writes, in each group of policies of namespace, members members of names nameBytes
// long, each applying configuration hash, scored at Redis's now so that they are live for the
// heartbeat TTL (Refresh scores them again). It is a single-server helper.
func Stuff(ctx context.Context, c redis.UniversalClient, namespace string, policies []string, members, nameBytes int, hash string) (Stuffed, error) {
	s := Stuffed{Client: c, Namespace: namespace, Policies: policies}
	const chunk = 1000
	for i := 0; i < members; i += chunk {
		n := min(chunk, members-i)
		zs := make([]redis.Z, n)
		fields := make([]any, 0, 2*n)
		for j := range zs {
			name := fmt.Sprintf("%07d-", i+j)
			name += strings.Repeat("x", max(nameBytes-len(name), 0))
			zs[j] = redis.Z{Score: 1, Member: name}
			fields = append(fields, name, hash)
		}
		pipe := c.Pipeline()
		pipe.ZAdd(ctx, s.template(), zs...)
		pipe.HSet(ctx, s.template()+":cfg", fields...)
		if _, err := pipe.Exec(ctx); err != nil {
			return s, fmt.Errorf("writing the members of the stuffed groups of %s: %w", namespace, err)
		}
	}
	pipe := c.Pipeline()
	for _, p := range policies {
		pipe.Copy(ctx, s.template()+":cfg", fleet.GroupConfigKey(namespace, p), 0, true)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return s, fmt.Errorf("writing the configuration hashes of the stuffed groups of %s: %w", namespace, err)
	}
	return s, s.Refresh(ctx)
}

// Refresh scores every member of the stuffed groups at Redis's now, as if all had just beaten.
func (s Stuffed) Refresh(ctx context.Context) error {
	now, err := s.Client.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("reading redis time: %w", err)
	}
	pipe := s.Client.Pipeline()
	for _, p := range s.Policies {
		pipe.ZUnionStore(ctx, fleet.GroupKey(s.Namespace, p), &redis.ZStore{
			Keys: []string{s.template()}, Weights: []float64{float64(now.UnixMilli())},
		})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("scoring the stuffed groups of %s: %w", s.Namespace, err)
	}
	return nil
}

// Delete removes the stuffed groups and their template.
func (s Stuffed) Delete(ctx context.Context) error {
	keys := []string{s.template(), s.template() + ":cfg"}
	for _, p := range s.Policies {
		keys = append(keys, fleet.GroupKey(s.Namespace, p), fleet.GroupConfigKey(s.Namespace, p))
	}
	return s.Client.Del(ctx, keys...).Err()
}
