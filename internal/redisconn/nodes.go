package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Nodes reaches every data node behind one URL, for settings Redis keeps per node and does not
// replicate (ACL users): the server; every master and replica of a cluster; a Sentinel group's
// master and every replica, which a failover may promote. Clients to the nodes are kept per
// address, one connection each, and closed by Close.
type Nodes struct {
	opts   *redis.UniversalOptions
	client redis.UniversalClient
	o      Options

	mu      sync.Mutex
	clients map[string]*redis.Client
}

// NewNodes returns the nodes behind rawURL. client is the client NewClient built from the
// same URL; a cluster's nodes are its own.
func NewNodes(rawURL string, opts Options, client redis.UniversalClient) (*Nodes, error) {
	uo, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	if o.Username != "" {
		uo.Username = o.Username
	}
	if o.Password != "" {
		uo.Password = o.Password
	}
	if err := o.setupDial(uo); err != nil {
		return nil, err
	}
	applySentinelOptions(uo, o)
	return &Nodes{opts: uo, client: client, o: o, clients: map[string]*redis.Client{}}, nil
}

// Each runs fn on every node, one after the other, and joins their errors. A node that cannot
// be listed (a Sentinel group none of whose sentinels answers) is an error.
func (n *Nodes) Each(ctx context.Context, fn func(ctx context.Context, node *redis.Client) error) error {
	switch {
	case n.opts.MasterName != "":
		addrs, err := n.sentinelNodes(ctx)
		if err != nil {
			return err
		}
		var errs []error
		for _, a := range addrs {
			if err := fn(ctx, n.nodeClient(a)); err != nil {
				errs = append(errs, fmt.Errorf("on %s: %w", a, err))
			}
		}
		return errors.Join(errs...)
	default:
		if cc, ok := n.client.(*redis.ClusterClient); ok {
			// ForEachShard calls its function concurrently, one goroutine a node: it only lists
			// the nodes here, and fn runs one after the other as documented, so a caller's fn
			// needs no lock of its own (a test's unlocked append lost a node 2 times in 12).
			var (
				mu    sync.Mutex
				nodes []*redis.Client
			)
			if err := cc.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
				mu.Lock()
				nodes = append(nodes, node)
				mu.Unlock()
				return nil
			}); err != nil {
				return fmt.Errorf("listing the nodes of the redis cluster: %w", err)
			}
			slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
			var errs []error
			for _, node := range nodes {
				if err := fn(ctx, node); err != nil {
					errs = append(errs, fmt.Errorf("on %s: %w", node.Options().Addr, err))
				}
			}
			return errors.Join(errs...)
		}
		if c, ok := n.client.(*redis.Client); ok {
			return fn(ctx, c)
		}
		return fmt.Errorf("listing redis nodes: unsupported client %T", n.client)
	}
}

// sentinelNodes is the master and the replicas a majority of the URL's sentinels agree on
// (agreedGroup): the nodes get the admin's credential, so one sentinel someone else pointed
// elsewhere is not enough to be sent it.
func (n *Nodes) sentinelNodes(ctx context.Context) ([]string, error) {
	v, err := agreedGroup(ctx, n.opts, n.o)
	if err != nil {
		return nil, fmt.Errorf("listing the nodes of sentinel group %s: %w", n.opts.MasterName, err)
	}
	return append([]string{v.master}, v.replicas...), nil
}

func sentinelGroup(ctx context.Context, sc *redis.SentinelClient, master string) ([]string, error) {
	m, err := sc.GetMasterAddrByName(ctx, master).Result()
	if err != nil {
		return nil, err
	}
	if len(m) != 2 {
		return nil, fmt.Errorf("master %s: unexpected address %q", master, m)
	}
	out := []string{net.JoinHostPort(m[0], m[1])}
	replicas, err := sc.Replicas(ctx, master).Result()
	if err != nil {
		return nil, err
	}
	for _, r := range replicas {
		if a := net.JoinHostPort(r["ip"], r["port"]); r["ip"] != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// nodeClient is the kept client of one node's address.
func (n *Nodes) nodeClient(addr string) *redis.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.clients[addr]; ok {
		return c
	}
	c := redis.NewClient(&redis.Options{
		Addr: addr, Username: n.opts.Username, Password: n.opts.Password, DB: n.opts.DB,
		TLSConfig: n.opts.TLSConfig, Dialer: n.o.dial, DialTimeout: n.o.DialTimeout, ReadTimeout: n.o.ReadTimeout,
		WriteTimeout: n.o.WriteTimeout, MaxRetries: -1, PoolSize: 1, DisableIdentity: true,
		ClientName: n.o.ClientName,
	})
	n.clients[addr] = c
	return c
}

// Close closes the clients Nodes opened (not the client it was given).
func (n *Nodes) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for a, c := range n.clients {
		errs = append(errs, c.Close())
		delete(n.clients, a)
	}
	return errors.Join(errs...)
}
