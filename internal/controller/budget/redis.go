package budget

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/controller/loop"
)

// NodeClients is what one Redis master reports about its clients.
type NodeClients struct {
	Addr string
	// MaxClients is CONFIG GET maxclients, or the configured override.
	MaxClients int64
	// Connected is INFO clients' connected_clients.
	Connected int64
}

// RedisClients reads maxclients and connected_clients from every master.
type RedisClients struct {
	Client redis.UniversalClient
	// MaxClients, when positive, is used instead of CONFIG GET, which managed Redis services
	// often refuse.
	MaxClients int64
}

// Nodes asks every master (every node of a cluster, the one server otherwise).
func (r *RedisClients) Nodes(ctx context.Context) ([]NodeClients, error) {
	var mu sync.Mutex
	var out []NodeClients
	ask := func(ctx context.Context, c redis.UniversalClient, addr string) error {
		n := NodeClients{Addr: addr, MaxClients: r.MaxClients}
		if n.MaxClients <= 0 {
			v, err := c.ConfigGet(ctx, "maxclients").Result()
			if err != nil {
				return fmt.Errorf("reading maxclients on %s (set --redis-maxclients where CONFIG is forbidden): %w", addr, err)
			}
			if n.MaxClients, err = strconv.ParseInt(v["maxclients"], 10, 64); err != nil {
				return fmt.Errorf("reading maxclients on %s: %q: %w", addr, v["maxclients"], err)
			}
		}
		info, err := c.Info(ctx, "clients").Result()
		if err != nil {
			return fmt.Errorf("reading connected_clients on %s: %w", addr, err)
		}
		if n.Connected, err = loop.InfoField(info, "connected_clients"); err != nil {
			return fmt.Errorf("reading connected_clients on %s: %w", addr, err)
		}
		mu.Lock()
		out = append(out, n)
		mu.Unlock()
		return nil
	}
	// Every sidecar holds a pool on every master, so each one is checked (as scripts are loaded,
	// internal/limiter/scripts).
	if cc, ok := r.Client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return ask(ctx, node, node.Options().Addr)
		})
		return out, err
	}
	addr := "redis"
	if c, ok := r.Client.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	return out, ask(ctx, r.Client, addr)
}
