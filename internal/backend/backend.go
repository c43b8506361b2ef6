// Package backend is the Redis each namespace is served by: the manager's own, or a
// RedisBackend's. It dials them, keeps the manager's clients for each in a Registry that every
// reconciler and the pod injector read, and holds what the manager does on one Redis (its
// scripts, its sidecars' heartbeats). It knows nothing of the reconcilers that use it.
package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/redisconn"
)

// Why namespaces can have a Redis of their own.
//
// Redis has no per-user bound on CPU or memory: a tenant calling the commands its user is
// granted on huge keys of its own (HGETALL of millions of fields, DEL without lazy freeing)
// blocks every other tenant's scripts for as long, and its writes share one maxmemory. Past
// what the scripts and ACL users bound, the remedy is a Redis of its own. A RedisBackend names
// one (a URL and the admin's credentials) and selects namespaces by their Namespace objects'
// labels, which a tenant does not set; everything the manager keeps per Redis follows the
// namespace's backend: the scripts, the namespace's ACL user and Secret, the heartbeats read for
// Enforced, the connection budget, the memory policy check, the metrics, and the URL the
// injector gives its pods. A namespace no backend selects uses the manager's own Redis.

// Manager-side defaults for every Redis: the manager's calls are not on a request path, so
// they get timeouts of seconds and a small pool.
const (
	// DefaultTimeout bounds the Redis calls of one reconcile (--redis-timeout).
	DefaultTimeout = 5 * time.Second
	// DefaultMaxBackoff caps the retry delay of a reconciler while its Redis is down
	// (--max-backoff), so that status recovers soon after Redis does.
	DefaultMaxBackoff = 30 * time.Second
	// DefaultCheckInterval is how often the manager checks, on every Redis node, that the
	// scripts are loaded and that the node did not restart (--script-check-interval): a second,
	// so that a Redis restarted empty is given its scripts and its ACL users within a second of
	// answering again. Each check is one SCRIPT EXISTS and one INFO server per node.
	DefaultCheckInterval = time.Second
	// ManagerPoolSize is the manager's own pool on each Redis, counted in the connection budget.
	ManagerPoolSize = 4
	// dialTimeout bounds the manager's dial, read and write on a Redis; poolTimeout its wait
	// for a connection of its pool.
	dialTimeout = 2 * time.Second
	poolTimeout = 3 * time.Second
)

// Timeout is d, or DefaultTimeout when d is not positive.
func Timeout(d time.Duration) time.Duration { return or(d, DefaultTimeout) }

// MaxBackoff is d, or DefaultMaxBackoff when d is not positive.
func MaxBackoff(d time.Duration) time.Duration { return or(d, DefaultMaxBackoff) }

// CheckInterval is d, or DefaultCheckInterval when d is not positive.
func CheckInterval(d time.Duration) time.Duration { return or(d, DefaultCheckInterval) }

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// ManagerOptions are the manager's client options for a Redis (its own or a RedisBackend's)
// with the admin's credentials and TLS. VerifyMaster is set: the admin's password goes to the
// master in the handshake, so only to one a majority of the sentinels names.
func ManagerOptions(creds Credentials, tls redisconn.TLSOptions, onTLSError func(error)) redisconn.Options {
	return redisconn.Options{
		PoolSize: ManagerPoolSize, DialTimeout: dialTimeout, ReadTimeout: dialTimeout, WriteTimeout: dialTimeout,
		PoolTimeout: poolTimeout, Username: creds.Username, Password: creds.Password, ClientName: "redline-manager",
		SentinelUsername: creds.SentinelUsername, SentinelPassword: creds.SentinelPassword,
		TLS: tls, TLSFileError: onTLSError,
		VerifyMaster: true,
	}
}

// NodeFunc runs fn on every node of a Redis (redisconn.Nodes.Each, EachSentinel).
type NodeFunc = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error

// DefaultLabel is the backend label of the manager's own Redis in metrics.
const DefaultLabel = "default"

// Backend is one Redis and what the manager keeps for it.
type Backend struct {
	// Name is the RedisBackend's name; "" is the manager's own Redis (--redis-url).
	Name string
	// URL is what the injector gives the sidecars of the namespaces it serves; "" for the
	// manager's own Redis leaves the injector's --sidecar-redis-url.
	URL string
	// Client is the manager's client (standalone, cluster or Sentinel).
	Client redis.UniversalClient
	// Nodes runs a function on every node, replicas included.
	Nodes NodeFunc
	// Sentinels runs a function on every sentinel as the admin; nil without Sentinel.
	Sentinels NodeFunc
	// MaxClients, when positive, is the backend's maxclients (a Redis refusing CONFIG GET).
	MaxClients int64
	// Budget is the backend's connection budget, for the injector to size pools from.
	Budget *connbudget.Publisher

	// Scripts and Sidecars are the backend's script store and heartbeat reader.
	Scripts  *Scripts
	Sidecars *Sidecars
	// Digest identifies the configuration it was dialed with: a RedisBackend whose URL,
	// credentials or maxClients change is dialed again.
	Digest string

	close func() error
}

// Label is the backend's value of the backend label in metrics.
func (b *Backend) Label() string {
	if b.Name == "" {
		return DefaultLabel
	}
	return b.Name
}

// ID tells a backend apart from the one it replaced.
func (b *Backend) ID() string { return b.Name + "/" + b.Digest }

// Describe names the backend in conditions and logs.
func (b *Backend) Describe() string {
	if b.Name == "" {
		return "the manager's Redis"
	}
	return "RedisBackend " + b.Name
}

// New wraps clients the caller built into a Backend; heartbeatTTL is the sidecars'. nodes nil
// runs on the client's masters (right for a single server); closeFn, if set, is called when
// the backend is replaced or removed.
func New(name, url string, c redis.UniversalClient, nodes, sentinels NodeFunc, maxClients int64, heartbeatTTL time.Duration, closeFn func() error) *Backend {
	if nodes == nil {
		nodes = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
			if cc, ok := c.(*redis.ClusterClient); ok {
				return cc.ForEachShard(ctx, fn)
			}
			rc, ok := c.(*redis.Client)
			if !ok {
				return fmt.Errorf("no node list for a %T", c)
			}
			return fn(ctx, rc)
		}
	}
	return &Backend{
		Name: name, URL: url, Client: c, Nodes: nodes, Sentinels: sentinels, MaxClients: maxClients,
		Budget:   &connbudget.Publisher{},
		Scripts:  &Scripts{Client: c, Nodes: nodes},
		Sidecars: &Sidecars{Client: c, TTL: heartbeatTTL},
		close:    closeFn,
	}
}

// Credentials are the admin's credentials for one Redis.
type Credentials struct {
	Username, Password                 string
	SentinelUsername, SentinelPassword string
}

// Dial builds the manager's clients for the RedisBackend name of spec with the admin's
// credentials, as the manager does for its own Redis: a small pool with timeouts of seconds
// (its calls are not on a request path), and with Sentinel a master only a majority of the
// sentinels names, since the admin's password goes to it. With a rediss:// URL it verifies
// the backend's certificates with tls's CA bundle and presents tls's client certificate (the
// manager's --redis-tls-* files), under the backend's own server name and minimum version.
func Dial(name string, spec v1alpha1.RedisBackendSpec, creds Credentials, heartbeatTTL time.Duration, tls redisconn.TLSOptions, onTLSError func(error)) (*Backend, error) {
	if redisconn.URLUsesTLS(spec.URL) {
		tls.ServerName = ""
		if t := spec.TLS; t != nil {
			tls.ServerName = t.ServerName
			tls.MinVersion = cmp.Or(t.MinVersion, tls.MinVersion)
		}
	} else {
		tls = redisconn.TLSOptions{}
	}
	opts := ManagerOptions(creds, tls, onTLSError)
	nodeOpts := opts
	nodeOpts.VerifyMaster = false
	return DialURL(name, spec.URL, spec.MaxClients, opts, nodeOpts, heartbeatTTL)
}

// DialURL builds the manager's clients for the Redis at url: the client with opts
// (ManagerOptions), and with nodeOpts one per node (replicas and sentinels too) for what each
// node keeps of its own. maxClients, when positive, is the Redis's maxclients for one that
// refuses CONFIG GET.
func DialURL(name, url string, maxClients int64, opts, nodeOpts redisconn.Options, heartbeatTTL time.Duration) (*Backend, error) {
	c, err := redisconn.NewClient(url, opts)
	if err != nil {
		return nil, err
	}
	nodes, err := redisconn.NewNodes(url, nodeOpts, c)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	var sentinels NodeFunc
	if nodes.IsSentinel() {
		sentinels = nodes.EachSentinel
	}
	return New(name, url, c, nodes.Each, sentinels, maxClients, heartbeatTTL, func() error {
		return errors.Join(nodes.Close(), c.Close())
	}), nil
}

// Close closes the backend's clients.
func (b *Backend) Close() error {
	if b == nil || b.close == nil {
		return nil
	}
	return b.close()
}

// NotReadyError is the error of a namespace whose RedisBackend the manager has no
// client for yet (its Secret is missing, its URL does not parse): its namespaces are not
// served by any other Redis meanwhile.
type NotReadyError struct{ Name string }

func (e *NotReadyError) Error() string {
	return "RedisBackend " + e.Name + " is not ready (see its Ready condition)"
}
