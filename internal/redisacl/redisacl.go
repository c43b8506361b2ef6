// Package redisacl gives each namespace its own Redis identity: an ACL user (Redis 6+) that may
// touch only that namespace's keys and run only the commands a sidecar runs, set on every node
// a sidecar could reach. It is the Redis side of tenant isolation; the controller decides who
// gets a user and where the credentials go. It knows nothing of Kubernetes.
//
// What a namespace's user may do:
//   - keys: rl:{<namespace>/* (the limiter's keys, see keyscheme.Key) and rl:hb:{<namespace>/*
//     (heartbeats, see fleet.KeyPrefix), nothing else; no Pub/Sub channels;
//   - commands: EVALSHA, the commands the sidecar's scripts call (Redis checks a script's calls
//     against the caller's ACL too, so these are allowed as plain commands as well, on the
//     user's own keys only), and what a connection needs (HELLO, AUTH, PING, CLIENT SETNAME,
//     SELECT, and on a cluster CLUSTER SLOTS/SHARDS/NODES and COMMAND for routing), and WAIT and
//     WAITAOF, which a rule's durability sends after its grants: each blocks only the
//     connection that sends it, for at most the timeout it names, and writes nothing.
//     WAITAOF exists from Redis 7.2; a node that does not know it (ACL SETUSER refuses the
//     whole rule set for an unknown command) gets the rest without it.
//
// Every script in Redis's cache can be run by anyone allowed EVALSHA (ACL cannot tell SHAs
// apart), so each script Redline loads, the manager's own group read included, caps its work
// inside itself whatever its ARGV and its keys hold (TestTenantCannotStallOthers), and the
// scripts call bounded commands where one exists (UNLINK, not DEL; GETRANGE of a few bytes, not
// GET; ZRANGE of a few and ZREM, not ZREMRANGEBYRANK), since whatever they call is granted. What
// a plain command of the grant can cost on a tenant's own key it stuffed (measured on Redis 7.0,
// BenchmarkTenantStall):
//   - O(1) or O(log N) whatever the key: TIME, TYPE, HLEN, ZCARD, ZSCORE, ZCOUNT, UNLINK (frees
//     a large value in the background), INCRBY and DECRBY (a value longer than 20 bytes is
//     refused as not an integer before it is read), PING and the connection's own;
//   - as long as the arguments: HSET, HDEL, HINCRBY, HMGET, HGET, ZADD, ZREM, SET (one ZADD of
//     a million members held every tenant 2 to 6 s); no ACL bounds an argument count;
//   - as long as the key: HGETALL, ZRANGE and ZRANGEBYSCORE over all of it, GETRANGE 0 -1 (each
//     reply carries it all); and freeing a large value on Redis's thread when PEXPIRE or
//     PEXPIREAT (in the past, or when it expires) or SET (over it) drop it, unless the server runs with
//     lazyfree-lazy-expire and lazyfree-lazy-server-del. A tenant needs no script for any of
//     these: what bounds them is a Redis per tenant.
//
// Not EVAL nor SCRIPT LOAD: with either, a tenant could run any Lua it writes on Redis's one
// thread (a loop that never ends stalls every tenant until an operator kills it), and SCRIPT
// FLUSH, FLUSHALL, CONFIG, ACL, KEYS, SCAN, CLIENT KILL and the rest are refused. So a sidecar
// cannot load a script Redis lost (restart, failover): it meets NOSCRIPT, is refused SCRIPT
// LOAD, decides by its failure mode, and the manager, which checks every node's scripts on a
// period, loads them again (see scriptwatcher.Watcher).
package redisacl

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// UserPrefix starts the name of every namespace's user; Username appends the namespace.
const UserPrefix = "redline-tenant-"

// Username is the ACL user of namespace.
func Username(namespace string) string { return UserPrefix + keyscheme.Part(namespace) }

// KeyPatterns are the key patterns namespace's user may touch. Both parts are escaped as the
// keys escape them (keyscheme.Part: only [A-Za-z0-9._-] pass raw), so no glob character of the
// pattern comes from a name, and the '/' after the namespace keeps "shop" from matching
// "shop2"'s keys.
func KeyPatterns(namespace string) []string {
	return []string{keyscheme.Prefix(namespace) + "*", fleet.KeyPrefix(namespace) + "*"}
}

// connectionCommands are what a go-redis connection of a sidecar sends besides its scripts:
// the handshake (HELLO with AUTH and SETNAME; AUTH and CLIENT SETNAME when HELLO is refused),
// SELECT for a database other than 0, PING, and on a cluster the topology and the commands'
// key positions.
var connectionCommands = []string{
	"hello", "auth", "ping", "client|setname", "select",
	"cluster|slots", "cluster|shards", "cluster|nodes", "command", "wait",
}

// newCommands are allowed commands a Redis before 7.2 does not know: Rules grants them beside
// Commands, and Ensure leaves them out on a node whose ACL SETUSER refuses them.
var newCommands = []string{"waitaof"}

// scriptCall finds the commands a script calls: redis.call('NAME', ...) or redis.pcall.
var scriptCall = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z]+)['"]`)

// anyCall counts every call, literal command name or not.
var anyCall = regexp.MustCompile(`redis\.p?call\(`)

// SidecarScripts are the scripts a sidecar runs: the limiter's algorithms, the returns (lease
// and give-back), the holds' settles, the in-flight slots', the calendar windows', the dry runs' and the heartbeat. The manager loads them all on every node, since a namespace's user cannot.
func SidecarScripts() []scripts.Script {
	return slices.Concat(scripts.All(), []scripts.Script{scripts.LeaseReturn(), scripts.HoldSettle(), scripts.HoldSettleTokenBucket(), scripts.HoldSettleSlidingWindowLog(),
		scripts.TokenReturn(), scripts.LogReturn(), scripts.SlotAcquire(), scripts.SlotRenew(),
		scripts.CalendarWindow(), scripts.CalendarReturn(), scripts.CalendarReserve(), scripts.CalendarSettle()}, scripts.Peeks(), fleet.Scripts())
}

// Commands returns the commands a namespace's user may run that every Redis 6+ knows (Rules adds
// newCommands), sorted, in ACL syntax (lower case, "container|sub" for a subcommand). It fails
// when a sidecar script calls a command whose name is not a literal, which this package could
// not allow.
var Commands = sync.OnceValues(func() ([]string, error) {
	set := map[string]bool{"evalsha": true}
	for _, c := range connectionCommands {
		set[c] = true
	}
	for _, s := range SidecarScripts() {
		calls := scriptCall.FindAllStringSubmatch(s.Source, -1)
		if n := len(anyCall.FindAllString(s.Source, -1)); n != len(calls) {
			return nil, fmt.Errorf("script %s makes %d redis calls, %d of them with a literal command name: every command must be known to be allowed", s.Name, n, len(calls))
		}
		for _, m := range calls {
			set[strings.ToLower(m[1])] = true
		}
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.Sort(out)
	return out, nil
})

// Rules returns the ACL SETUSER rules of namespace's user holding passwords, without the
// user's name. "reset" first: whatever the user held before (passwords, keys, channels,
// commands, selectors) is replaced in the same atomic command, never widened.
func Rules(namespace string, passwords []string) ([]string, error) {
	cmds, err := Commands()
	if err != nil {
		return nil, err
	}
	rules := []string{"reset", "on"}
	for _, p := range passwords {
		rules = append(rules, ">"+p)
	}
	for _, k := range KeyPatterns(namespace) {
		rules = append(rules, "~"+k)
	}
	for _, c := range slices.Concat(cmds, newCommands) {
		rules = append(rules, "+"+c)
	}
	return rules, nil
}

// ErrUnavailable is wrapped by errors of a Redis that answered but refused an ACL command: a
// server before 6, ACL renamed away, a managed service that does not offer it, or an admin
// user without the permission. A network error is not it.
var ErrUnavailable = errors.New("redis refuses ACL commands")

// Node is one Redis server, as Ensure and Remove need it.
type Node interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// Ensure sets namespace's user on every node with exactly passwords (at least one), in one
// ACL SETUSER per node. Connections already authenticated stay so, whatever the passwords
// become: to rotate, Ensure with the old and the new password, hand out the new, and Ensure
// with the new one alone once every client has it.
func Ensure(ctx context.Context, nodes []Node, namespace string, passwords []string) error {
	if len(passwords) == 0 {
		return errors.New("setting a redis user without a password")
	}
	rules, err := Rules(namespace, passwords)
	if err != nil {
		return err
	}
	args := make([]any, 0, 3+len(rules))
	args = append(args, "acl", "setuser", Username(namespace))
	older := slices.Clone(args) // without newCommands
	for _, r := range rules {
		args = append(args, r)
		if !slices.Contains(newCommands, strings.TrimPrefix(r, "+")) {
			older = append(older, r)
		}
	}
	return each(ctx, nodes, func(ctx context.Context, n Node) error {
		err := n.Do(ctx, args...).Err()
		if err != nil && redis.HasErrorPrefix(err, "Error in ACL SETUSER modifier") && refusesNew(err) {
			err = n.Do(ctx, older...).Err() // a Redis before 7.2
		}
		return classify(err)
	})
}

// refusesNew says whether ACL SETUSER refused one of newCommands as unknown.
func refusesNew(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") && slices.ContainsFunc(newCommands, func(c string) bool {
		return strings.Contains(msg, "'+"+c+"'")
	})
}

// Remove deletes namespace's user from every node; Redis closes its connections.
func Remove(ctx context.Context, nodes []Node, namespace string) error {
	return each(ctx, nodes, func(ctx context.Context, n Node) error {
		return classify(n.Do(ctx, "acl", "deluser", Username(namespace)).Err())
	})
}

// Probe says whether every node answers ACL commands: ErrUnavailable when one refuses them.
func Probe(ctx context.Context, nodes []Node) error {
	return each(ctx, nodes, func(ctx context.Context, n Node) error {
		return classify(n.Do(ctx, "acl", "whoami").Err())
	})
}

// OpenUsers lists the users of any node that let anyone in without a password: on, with
// nopass. Then a namespace's own user isolates nothing, since a tenant can connect as such a
// user, which holds whatever keys and commands the admin gave it (the default user: all). Not
// only the default user: an admin's own user created with nopass opens Redis as well. Names
// are sorted and unique; ACL LIST costs O(users) per node.
func OpenUsers(ctx context.Context, nodes []Node) ([]string, error) {
	set := map[string]bool{}
	err := each(ctx, nodes, func(ctx context.Context, n Node) error {
		lines, err := n.Do(ctx, "acl", "list").StringSlice()
		if err != nil {
			return classify(err)
		}
		for _, l := range lines {
			// "user <name> on|off [nopass] [sanitize-payload] #<sha>... ~keys &channels +@cmds"
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "user" {
				continue
			}
			if slices.Contains(f[2:], "on") && slices.Contains(f[2:], "nopass") {
				set[f[1]] = true
			}
		}
		return nil
	})
	out := make([]string, 0, len(set))
	for u := range set {
		out = append(out, u)
	}
	slices.Sort(out)
	return out, err
}

func each(ctx context.Context, nodes []Node, fn func(context.Context, Node) error) error {
	if len(nodes) == 0 {
		return errors.New("no redis node to set users on")
	}
	var errs []error
	for _, n := range nodes {
		if err := fn(ctx, n); err != nil {
			errs = append(errs, fmt.Errorf("on %s: %w", nodeName(n), err))
		}
	}
	return errors.Join(errs...)
}

func nodeName(n Node) string {
	if c, ok := n.(*redis.Client); ok {
		return c.Options().Addr
	}
	return "redis"
}

// classify marks an error Redis itself returned (it answered, and refused) as ErrUnavailable.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if rerr, ok := errors.AsType[redis.Error](err); ok {
		return fmt.Errorf("%w: %s", ErrUnavailable, rerr.Error())
	}
	return err
}
