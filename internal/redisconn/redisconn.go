// Package redisconn builds the Redis clients Redline uses, from one URL grammar (a server, a
// cluster from a seed list, or Sentinel), with a bounded pool and hot-path timeouts.
package redisconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options bound the connection pool and the timeouts of a Redis client built by NewClient.
// The zero value gives defaults fit for a per-request hot path: a decision that cannot be made in
// tens of milliseconds is better made by the failure mode than waited for.
type Options struct {
	// PoolSize is the number of connections kept per node (default 16).
	PoolSize int
	// MaxActiveConns caps open connections per node, idle or busy (default 2*PoolSize).
	MaxActiveConns int
	// MinIdleConns is kept open while idle, so a burst finds warm connections (default 2).
	MinIdleConns int
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
	// TLSConfig overrides the TLS settings of a rediss:// URL, or enables TLS for redis://.
	TLSConfig *tls.Config
	// ClientName is sent with CLIENT SETNAME on every connection.
	ClientName string
}

func (o Options) withDefaults() Options {
	if o.PoolSize <= 0 {
		o.PoolSize = 16
	}
	if o.MaxActiveConns <= 0 {
		o.MaxActiveConns = 2 * o.PoolSize
	}
	if o.MinIdleConns <= 0 {
		o.MinIdleConns = 2
	}
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
// Query parameters: cluster, master_name, client_name. The pool and timeouts come from opts.
func NewClient(rawURL string, opts Options) (redis.UniversalClient, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	uo := &redis.UniversalOptions{
		Addrs:            u.addrs,
		DB:               u.db,
		Username:         u.username,
		Password:         u.password,
		MasterName:       u.masterName,
		IsClusterMode:    u.cluster,
		ClientName:       u.clientName,
		PoolSize:         o.PoolSize,
		MaxActiveConns:   o.MaxActiveConns,
		MinIdleConns:     o.MinIdleConns,
		PoolTimeout:      o.PoolTimeout,
		DialTimeout:      o.DialTimeout,
		ReadTimeout:      o.ReadTimeout,
		WriteTimeout:     o.WriteTimeout,
		MaxRetries:       -1,
		PipelinePoolSize: -1, // one bounded pool for commands and pipelines alike
		DisableIdentity:  true,
	}
	if o.MaxRetries > 0 {
		uo.MaxRetries = o.MaxRetries
	}
	if u.masterName != "" {
		// With Sentinel, URL credentials authenticate to the sentinels and to the master.
		uo.SentinelUsername, uo.SentinelPassword = u.username, u.password
	}
	if u.tls {
		uo.TLSConfig = &tls.Config{ServerName: u.firstHost, MinVersion: tls.VersionTLS12}
	}
	if o.TLSConfig != nil {
		uo.TLSConfig = o.TLSConfig
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
	return redis.NewUniversalClient(uo), nil
}

type parsedURL struct {
	addrs              []string
	firstHost          string
	db                 int
	username, password string
	masterName         string
	cluster, tls       bool
	clientName         string
}

// parseURL splits the host list by hand: net/url refuses a comma-separated host list.
func parseURL(raw string) (parsedURL, error) {
	var p parsedURL
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return p, fmt.Errorf("%w: %q has no scheme", ErrInvalidURL, redact(raw))
	}
	sentinel := false
	switch scheme {
	case "redis":
	case "rediss":
		p.tls = true
	case "redis+sentinel":
		sentinel = true
	case "rediss+sentinel":
		sentinel, p.tls = true, true
	default:
		return p, fmt.Errorf("%w: scheme %q, want redis, rediss, redis+sentinel or rediss+sentinel", ErrInvalidURL, scheme)
	}
	authority, pathQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathQuery = rest[:i], rest[i:]
	}
	hosts := authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		ui, err := url.Parse("redis://" + authority[:i+1] + "h")
		if err != nil {
			return p, fmt.Errorf("%w: credentials: %w", ErrInvalidURL, err)
		}
		p.username = ui.User.Username()
		p.password, _ = ui.User.Password()
		hosts = authority[i+1:]
	}
	defPort := "6379"
	if sentinel {
		defPort = "26379"
	}
	var err error
	if p.addrs, p.firstHost, err = parseHosts(hosts, defPort); err != nil {
		return p, err
	}
	rest2, err := url.Parse("redis://h" + pathQuery)
	if err != nil {
		return p, fmt.Errorf("%w: path or query: %w", ErrInvalidURL, err)
	}
	segs := strings.FieldsFunc(rest2.Path, func(r rune) bool { return r == '/' })
	if sentinel && len(segs) > 0 {
		p.masterName, segs = segs[0], segs[1:]
	}
	switch len(segs) {
	case 0:
	case 1:
		if p.db, err = strconv.Atoi(segs[0]); err != nil || p.db < 0 {
			return p, fmt.Errorf("%w: database %q is not a number", ErrInvalidURL, segs[0])
		}
	default:
		return p, fmt.Errorf("%w: path %q", ErrInvalidURL, rest2.Path)
	}
	if err := p.applyQuery(rest2.Query()); err != nil {
		return p, err
	}
	if len(p.addrs) > 1 && !sentinel {
		p.cluster = true
	}
	if sentinel && p.masterName == "" {
		return p, fmt.Errorf("%w: sentinel URL needs a master name (path or master_name)", ErrInvalidURL)
	}
	if p.cluster && p.db != 0 {
		return p, fmt.Errorf("%w: Redis Cluster has only database 0", ErrInvalidURL)
	}
	return p, nil
}

// parseHosts reads a comma-separated host[:port] list; a host without a port gets defPort.
func parseHosts(hosts, defPort string) (addrs []string, first string, err error) {
	for h := range strings.SplitSeq(hosts, ",") {
		if h == "" {
			return nil, "", fmt.Errorf("%w: empty host in %q", ErrInvalidURL, hosts)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.Trim(h, "[]"), defPort
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, "", fmt.Errorf("%w: port of %q: %w", ErrInvalidURL, h, err)
		}
		if first == "" {
			first = host
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, first, nil
}

// applyQuery reads the URL's parameters: cluster, master_name and client_name.
func (p *parsedURL) applyQuery(q url.Values) error {
	for k, v := range q {
		val := v[len(v)-1]
		switch k {
		case "cluster":
			c, err := strconv.ParseBool(val)
			if err != nil {
				return fmt.Errorf("%w: cluster=%q: %w", ErrInvalidURL, val, err)
			}
			p.cluster = c
		case "master_name":
			p.masterName = val
		case "client_name":
			p.clientName = val
		default:
			return fmt.Errorf("%w: unknown parameter %q", ErrInvalidURL, k)
		}
	}
	return nil
}

// RedactURL returns a Redis URL fit for logs: any credentials are replaced by ***.
func RedactURL(raw string) string { return redact(raw) }

// redact hides the credentials of a URL quoted in an error or a log, keeping its scheme.
func redact(raw string) string {
	i := strings.LastIndexByte(raw, '@')
	if i < 0 {
		return raw
	}
	if scheme, _, ok := strings.Cut(raw[:i], "://"); ok && !strings.ContainsAny(scheme, "/@") {
		return scheme + "://***" + raw[i:]
	}
	return "***" + raw[i:]
}
