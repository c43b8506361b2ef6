// Package redisconn builds the Redis clients Redline uses, from one URL grammar (a server, a
// cluster from a seed list, or Sentinel), with a bounded pool and hot-path timeouts.
package redisconn

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options bound the connection pool and the timeouts of a Redis client built by NewClient.
// The zero value gives defaults fit for a per-request hot path: a decision that cannot be made in
// tens of milliseconds is better made by the failure mode than waited for.
type Options struct {
	// PoolSize is the number of connections a client may hold per node (default 16).
	PoolSize int
	// MaxActiveConns caps open connections per node, idle or busy (default PoolSize). go-redis
	// lets a pool open more than PoolSize under a burst unless this caps it; with the cap a
	// pod's connections never exceed its pool, which is what the controller's connection
	// budget counts (maxReplicas x pool).
	MaxActiveConns int
	// MinIdleConns is kept open while idle (default 0: connections open lazily, on the first
	// call that needs one). A warm connection saves a burst one dial, but a fleet of thousands
	// of pods at rest would hold MinIdleConns each on every node for nothing.
	MinIdleConns int
	// MaxIdleConns is the most idle connections kept per node (default PoolSize) and
	// ConnMaxIdleTime how long one may stay idle before its socket is closed (default 1m; see
	// idle.go). go-redis closes a connection returned while MaxIdleConns are idle, so a cap
	// below the concurrency a sidecar runs at closes and redials connections under load, when
	// Redis can least afford it (measured under the compare-envoy load with a cap of 4: 175
	// dials a second, and a third of the sidecar's allocations in the dialed connections'
	// buffers). It is the idle time that empties a pool at rest: a scaled-out fleet at rest
	// holds the connection its heartbeat uses per pod, not its pool.
	MaxIdleConns    int
	ConnMaxIdleTime time.Duration
	// BufferSize is each connection's read and write buffer (default 8 KiB; go-redis's is
	// 32 KiB each). Decisions are scripts of a few arguments answered by six integers, so a
	// pipeline of tens of them fits, and a larger one only takes another read.
	BufferSize int
	// Stats, when set, counts the client's sockets (open now, dialed, closed for being idle)
	// and the node changes it saw (changes.go).
	Stats *ConnStats
	// PoolTimeout is how long a call waits for a free connection (default 50ms).
	PoolTimeout time.Duration
	// DialTimeout bounds opening a connection (default 250ms).
	DialTimeout time.Duration
	// ReadTimeout bounds reading a reply (default 50ms).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a command (default 50ms).
	WriteTimeout time.Duration
	// MaxRetries is how often a failed command is retried (default 0: a script is not
	// idempotent, and a retried decision could count twice).
	MaxRetries int
	// Username and Password override the URL's credentials (for a password from a Secret).
	Username, Password string
	// Credentials, when set, is asked for the username and password at every new connection
	// (see FileCredentials) and wins over Username and Password.
	Credentials func(context.Context) (username, password string, err error)
	// SentinelUsername and SentinelPassword override the credentials a redis+sentinel URL
	// gives the sentinels (the manager's admin credential, from a file).
	SentinelUsername, SentinelPassword string
	// SentinelCredentials, when set, is asked for the sentinels' username and password at
	// every new connection to one of the URL's sentinels (see FileCredentials), which is then
	// authenticated before go-redis's handshake. Static sentinel credentials, when given too
	// (a URL's, with tenant ACLs off), authenticate again in that handshake and win. A
	// sidecar's sentinel reader comes from its mounted Secret so.
	SentinelCredentials func(context.Context) (username, password string, err error)
	// VerifyMaster, with Sentinel, refuses to connect to a master that a majority of the URL's
	// sentinels does not name (ErrMasterUnverified): for a client that authenticates to the
	// master with a credential worth stealing (the manager's).
	VerifyMaster bool
	// TLS refines a rediss:// or rediss+sentinel:// URL's TLS (see TLSOptions); with a URL
	// without TLS, setting it is an error rather than a plaintext connection someone thought
	// was verified.
	TLS TLSOptions
	// TLSFileError, when set, is told when a TLS file changed and cannot be used (the last
	// good content is kept): once for each such change.
	TLSFileError func(error)
	// ClientName is sent with CLIENT SETNAME on every connection.
	ClientName string

	// dial opens every connection of the client, sentinels' and nodes' included: TCP, or TLS
	// when the URL says so (set by setupDial).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (o Options) withDefaults() Options {
	if o.PoolSize <= 0 {
		o.PoolSize = 16
	}
	if o.MaxActiveConns <= 0 {
		o.MaxActiveConns = o.PoolSize
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = o.PoolSize
	}
	if o.BufferSize <= 0 {
		o.BufferSize = 8 << 10
	}
	o.MaxIdleConns = max(o.MaxIdleConns, o.MinIdleConns)
	if o.Stats == nil {
		o.Stats = &ConnStats{}
	}
	if o.ConnMaxIdleTime <= 0 {
		o.ConnMaxIdleTime = time.Minute
	}
	o.MinIdleConns = max(o.MinIdleConns, 0)
	if o.PoolTimeout <= 0 {
		o.PoolTimeout = 50 * time.Millisecond
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 250 * time.Millisecond
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 50 * time.Millisecond
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 50 * time.Millisecond
	}
	return o
}

// setupDial sets how o's connections to the URL uo are opened: the dialer go-redis would use
// (TCP keep-alive), over TLS with o.TLS when parseURL found a TLS scheme (uo.TLSConfig set).
func (o *Options) setupDial(uo *redis.UniversalOptions) error {
	if uo.TLSConfig == nil {
		if !o.TLS.IsZero() {
			return errors.New("TLS options are set but the redis URL does not use TLS: use rediss:// (or rediss+sentinel://)")
		}
		o.dial = redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout})
		return nil
	}
	f, err := newTLSFiles(o.TLS, o.TLSFileError)
	if err != nil {
		return err
	}
	// go-redis reads it only to know that connections are TLS: o.dial makes them.
	uo.TLSConfig = f.config()
	o.dial = f.dialer(o.DialTimeout)
	return nil
}

// ErrInvalidURL is wrapped by errors about a Redis URL NewClient cannot use.
var ErrInvalidURL = errors.New("invalid redis url")

// NewClient builds a Redis client from a URL:
//
//	redis://[user:password@]host:port[/db]            one server
//	rediss://...                                      the same over TLS
//	redis://host1:port,host2:port,host3:port          Redis Cluster, from a seed list
//	redis://host:port?cluster=true                    Redis Cluster, from one seed
//	redis+sentinel://[user:pw@]s1:26379,s2:26379/mymaster[/db]   Sentinel (or ?master_name=)
//
// Query parameters: cluster, master_name, client_name. The pool and timeouts come from opts,
// and so do the CAs, client certificate, server name and minimum version of a TLS scheme
// (opts.TLS), for every connection: to the sentinels too, which are spoken to over TLS when the
// master is.
func NewClient(rawURL string, opts Options) (redis.UniversalClient, error) {
	uo, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	uo.PoolSize = o.PoolSize
	uo.MaxActiveConns = o.MaxActiveConns
	uo.MinIdleConns = o.MinIdleConns
	uo.MaxIdleConns = o.MaxIdleConns
	uo.ConnMaxIdleTime = o.ConnMaxIdleTime
	uo.ReadBufferSize, uo.WriteBufferSize = o.BufferSize, o.BufferSize
	uo.PoolTimeout = o.PoolTimeout
	uo.DialTimeout = o.DialTimeout
	uo.ReadTimeout = o.ReadTimeout
	uo.WriteTimeout = o.WriteTimeout
	uo.MaxRetries = -1
	if o.MaxRetries > 0 {
		uo.MaxRetries = o.MaxRetries
	}
	uo.PipelinePoolSize = -1 // one bounded pool for commands and pipelines alike
	uo.DisableIdentity = true
	if err := o.setupDial(uo); err != nil {
		return nil, err
	}
	if o.Username != "" {
		uo.Username = o.Username
	}
	if o.Password != "" {
		uo.Password = o.Password
	}
	if o.ClientName != "" {
		uo.ClientName = o.ClientName
	}
	if o.Credentials != nil {
		uo.CredentialsProviderContext = o.Credentials
	}
	applySentinelOptions(uo, o)
	// Every connection tracked so that idle ones close (idle.go).
	dial := o.dial
	if uo.MasterName != "" && o.SentinelCredentials != nil {
		dial = sentinelAuthDialer(slices.Clone(uo.Addrs), o.SentinelCredentials, o.DialTimeout+o.ReadTimeout, dial)
	}
	if uo.MasterName != "" && o.VerifyMaster {
		dial = verifyingDialer(uo, o, dial)
	}
	uo.Dialer = newReaper(o.ConnMaxIdleTime, o.Stats).dialer(dial)
	c := redis.NewUniversalClient(uo)
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.AddHook(clusterFailover{cc})
	}
	watchNodes(c, o.Stats)
	return c, nil
}
