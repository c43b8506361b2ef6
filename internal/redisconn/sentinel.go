package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrMasterUnverified is wrapped by the error of a dial to a master that a majority of the
// URL's sentinels do not name (Options.VerifyMaster).
var ErrMasterUnverified = errors.New("redis master not named by a majority of the sentinels")

// sentinelOptions are the options of a short-lived client to one sentinel.
func sentinelOptions(addr string, uo *redis.UniversalOptions, o Options) *redis.Options {
	return &redis.Options{
		Addr: addr, Username: uo.SentinelUsername, Password: uo.SentinelPassword,
		TLSConfig: uo.TLSConfig, Dialer: o.dial, DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout,
		WriteTimeout: o.WriteTimeout, MaxRetries: -1, PoolSize: 1, DisableIdentity: true,
	}
}

// applySentinelOptions puts Options' sentinel credentials over the URL's.
func applySentinelOptions(uo *redis.UniversalOptions, o Options) {
	if o.SentinelUsername != "" {
		uo.SentinelUsername = o.SentinelUsername
	}
	if o.SentinelPassword != "" {
		uo.SentinelPassword = o.SentinelPassword
	}
}

// sentinelView is what a majority of the URL's sentinels agree on: the master, and the replicas
// a majority of them report.
type sentinelView struct {
	master   string
	replicas []string
}

// agreedGroup asks every sentinel of the URL for the master and its replicas, and keeps what
// more than half of them (of all listed, answering or not) say. A sentinel that was
// reconfigured by someone else (SENTINEL MONITOR at an address of theirs) is outvoted: the
// manager's admin credential goes only where the group as a whole points.
func agreedGroup(ctx context.Context, uo *redis.UniversalOptions, o Options) (sentinelView, error) {
	masters, replicas := map[string]int{}, map[string]int{}
	var errs []error
	for _, s := range uo.Addrs {
		sc := redis.NewSentinelClient(sentinelOptions(s, uo, o))
		addrs, err := sentinelGroup(ctx, sc, uo.MasterName)
		_ = sc.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("sentinel %s: %w", s, err))
			continue
		}
		masters[addrs[0]]++
		for _, r := range addrs[1:] {
			replicas[r]++
		}
	}
	quorum := len(uo.Addrs)/2 + 1
	var v sentinelView
	for m, n := range masters {
		if n >= quorum {
			v.master = m
		}
	}
	if v.master == "" {
		return v, fmt.Errorf("%w: group %s, %d sentinel(s) listed, masters named %v: %w",
			ErrMasterUnverified, uo.MasterName, len(uo.Addrs), masters, errors.Join(errs...))
	}
	for r, n := range replicas {
		if n >= quorum && r != v.master {
			v.replicas = append(v.replicas, r)
		}
	}
	slices.Sort(v.replicas)
	return v, nil
}

// verifyingDialer refuses to connect to a data node (any address that is not one of the URL's
// sentinels) unless a majority of the sentinels names it as the master: the manager
// authenticates there with the admin's credential at once. go-redis dials sentinels with the
// same dialer, so a sentinel the URL does not list is refused too: the manager's client uses
// the URL's sentinels only.
func verifyingDialer(uo *redis.UniversalOptions, o Options, dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !slices.Contains(uo.Addrs, addr) {
			v, err := agreedGroup(ctx, uo, o)
			if err != nil {
				return nil, fmt.Errorf("verifying master %s before connecting: %w", addr, err)
			}
			if v.master != addr {
				return nil, fmt.Errorf("%w: asked to connect to %s, the sentinels agree on %s", ErrMasterUnverified, addr, v.master)
			}
		}
		return dial(ctx, network, addr)
	}
}

// sentinelAuthDialer authenticates every new connection to one of the URL's sentinels with
// the credentials creds gives at that moment (AUTH, before go-redis's handshake, which then
// runs on an authenticated connection). go-redis takes only static sentinel credentials
// (FailoverOptions.SentinelPassword); this lets a sidecar that started before its Secret
// existed, or whose Secret changed, reach the sentinels without a restart. Sentinels a
// sentinel reports but the URL does not list are dialed without credentials: list them all.
func sentinelAuthDialer(sentinels []string, creds func(context.Context) (string, string, error), timeout time.Duration,
	dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil || !slices.Contains(sentinels, addr) {
			return c, err
		}
		user, pw, err := creds(ctx)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("reading the sentinel credentials: %w", err)
		}
		if pw == "" {
			return c, nil
		}
		if err := auth(c, user, pw, timeout); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("authenticating to sentinel %s as %q: %w", addr, user, err)
		}
		return c, nil
	}
}

// auth sends AUTH [user] password on c and reads the one-line reply.
func auth(c net.Conn, user, pw string, timeout time.Duration) error {
	args := []string{"AUTH", pw}
	if user != "" {
		args = []string{"AUTH", user, pw}
	}
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write([]byte(b.String())); err != nil {
		return err
	}
	// Byte by byte up to the newline: nothing after the reply may be taken from go-redis.
	var line []byte
	one := make([]byte, 1)
	for len(line) < 512 {
		if _, err := c.Read(one); err != nil {
			return err
		}
		if one[0] == '\n' {
			break
		}
		line = append(line, one[0])
	}
	reply := strings.TrimRight(string(line), "\r")
	if reply != "+OK" {
		return fmt.Errorf("sentinel answered %q", strings.TrimPrefix(reply, "-"))
	}
	return nil
}

// EachSentinel runs fn on every sentinel: the URL's and the ones a majority of them report
// (SENTINEL SENTINELS), since Sentinel keeps ACL users per process. A URL without sentinels runs
// nothing. A reported sentinel that cannot be reached is an error like a listed one.
func (n *Nodes) EachSentinel(ctx context.Context, fn func(ctx context.Context, sentinel *redis.Client) error) error {
	if n.opts.MasterName == "" {
		return nil
	}
	addrs := slices.Clone(n.opts.Addrs)
	reported := map[string]int{}
	var errs []error
	for _, s := range n.opts.Addrs {
		sc := redis.NewSentinelClient(sentinelOptions(s, n.opts, n.o))
		peers, err := sc.Sentinels(ctx, n.opts.MasterName).Result()
		_ = sc.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the sentinels known to %s: %w", s, err))
			continue
		}
		for _, p := range peers {
			if p["ip"] != "" {
				reported[net.JoinHostPort(p["ip"], p["port"])]++
			}
		}
	}
	// A sentinel learns its peers from hello messages on the master; only one that a majority
	// of the listed sentinels reports gets the admin's credential.
	var extra []string
	for a, k := range reported {
		if k >= len(n.opts.Addrs)/2+1 && !slices.Contains(addrs, a) {
			extra = append(extra, a)
		}
	}
	slices.Sort(extra)
	addrs = append(addrs, extra...)
	for _, a := range addrs {
		c := redis.NewClient(sentinelOptions(a, n.opts, n.o))
		err := fn(ctx, c)
		_ = c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("on sentinel %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

// IsSentinel says whether the URL names a Sentinel group.
func (n *Nodes) IsSentinel() bool { return n.opts.MasterName != "" }
