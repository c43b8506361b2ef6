package redisconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// parseURL turns a URL of NewClient's grammar into client options. go-redis's ParseURL reads
// the credentials, the database, client_name and the TLS settings. What it lacks stays here: a
// comma-separated host list (a cluster's seeds or the sentinels, which net/url refuses), the
// redis+sentinel schemes with the master in the path and the sentinel port as default, the
// cluster parameter, and a short list of parameters, since the pool and the timeouts come from
// Options and not from a URL. ParseClusterURL and ParseFailoverURL do not serve: they take extra
// hosts only as addr= parameters, the first ignores the database and the second defaults
// sentinels to port 6379.
func parseURL(raw string) (*redis.UniversalOptions, error) {
	u, err := splitURL(raw)
	if err != nil {
		return nil, err
	}
	o, err := redis.ParseURL(u.first())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, redactError(err))
	}
	if o.DB < 0 {
		return nil, fmt.Errorf("%w: database %d is negative", ErrInvalidURL, o.DB)
	}
	if u.sentinel && u.masterName == "" {
		return nil, fmt.Errorf("%w: sentinel URL needs a master name (path or master_name)", ErrInvalidURL)
	}
	if u.cluster && o.DB != 0 {
		return nil, fmt.Errorf("%w: Redis Cluster has only database 0", ErrInvalidURL)
	}
	uo := &redis.UniversalOptions{
		Addrs:         u.addrs,
		DB:            o.DB,
		Username:      o.Username,
		Password:      o.Password,
		ClientName:    o.ClientName,
		MasterName:    u.masterName,
		IsClusterMode: u.cluster,
	}
	if o.TLSConfig != nil {
		// A TLS scheme: TLSOptions' defaults, until setupDial puts the client's own. Not
		// go-redis's ServerName, the URL's first host: a cluster's nodes and a Sentinel
		// group's master are verified under the hosts they are dialed at.
		uo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if u.sentinel {
		// With Sentinel, URL credentials authenticate to the sentinels and to the master.
		uo.SentinelUsername, uo.SentinelPassword = o.Username, o.Password
	}
	return uo, nil
}

// urlParts is a URL of NewClient's grammar taken apart, with what go-redis does not read
// taken out of it.
type urlParts struct {
	base              string // redis or rediss
	sentinel, cluster bool
	userinfo          string // with its "@"; "" without
	addrs             []string
	path              string
	params            url.Values
	masterName        string
}

// first is the URL go-redis reads: the first host, the credentials, the database and the
// parameters it knows.
func (u *urlParts) first() string {
	first := u.base + "://" + u.userinfo + u.addrs[0] + u.path
	if len(u.params) > 0 {
		first += "?" + u.params.Encode()
	}
	return first
}

// splitURL takes raw apart: its scheme, credentials, hosts, path (with a sentinel URL's master
// name) and parameters.
func splitURL(raw string) (*urlParts, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("%w: %q has no scheme", ErrInvalidURL, redact(raw))
	}
	u := &urlParts{base: scheme}
	switch scheme {
	case "redis", "rediss":
	case "redis+sentinel", "rediss+sentinel":
		u.base, u.sentinel = strings.TrimSuffix(scheme, "+sentinel"), true
	default:
		return nil, fmt.Errorf("%w: scheme %q, want redis, rediss, redis+sentinel or rediss+sentinel", ErrInvalidURL, scheme)
	}
	authority, pathQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathQuery = rest[:i], rest[i:]
	}
	hosts := authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		u.userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	defPort := "6379"
	if u.sentinel {
		defPort = "26379"
	}
	var err error
	if u.addrs, err = parseHosts(hosts, defPort); err != nil {
		return nil, err
	}
	path, query, _ := strings.Cut(pathQuery, "?")
	if u.params, err = url.ParseQuery(query); err != nil {
		return nil, fmt.Errorf("%w: query: %w", ErrInvalidURL, err)
	}
	u.path, u.cluster = path, len(u.addrs) > 1 && !u.sentinel
	if u.sentinel {
		// The master is the first path segment; what follows is the database.
		segs := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
		if len(segs) > 0 {
			u.masterName, u.path = segs[0], "/"+strings.Join(segs[1:], "/")
		}
	}
	return u, u.takeParams()
}

// takeParams reads and removes the parameters go-redis does not know (cluster, master_name)
// and refuses any it does not know either: the pool and the timeouts come from Options.
func (u *urlParts) takeParams() error {
	for k, v := range u.params {
		val := v[len(v)-1]
		switch k {
		case "cluster":
			var err error
			if u.cluster, err = strconv.ParseBool(val); err != nil {
				return fmt.Errorf("%w: cluster=%q: %w", ErrInvalidURL, val, err)
			}
			u.params.Del(k)
		case "master_name":
			u.masterName = val
			u.params.Del(k)
		case "client_name":
		default:
			return fmt.Errorf("%w: unknown parameter %q", ErrInvalidURL, k)
		}
	}
	return nil
}

// parseHosts reads a comma-separated host[:port] list; a host without a port gets defPort.
func parseHosts(hosts, defPort string) ([]string, error) {
	var addrs []string
	for h := range strings.SplitSeq(hosts, ",") {
		if h == "" {
			return nil, fmt.Errorf("%w: empty host in %q", ErrInvalidURL, hosts)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.Trim(h, "[]"), defPort
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, fmt.Errorf("%w: port of %q: %w", ErrInvalidURL, h, err)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

// redactError keeps the credentials of a URL that net/url quotes in its errors out of ours.
func redactError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return &url.Error{Op: ue.Op, URL: redact(ue.URL), Err: ue.Err}
	}
	return err
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
