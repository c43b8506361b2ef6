package redisacl

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// SentinelReaderUser is the ACL user sidecars authenticate to the sentinels as. It may only
// look the master and the replicas up and follow the switch events: what go-redis's
// FailoverClient (v9.23, sentinel.go) sends to a sentinel, and nothing else.
//
// One user shared by every namespace, not one per namespace: what it can read is the group's
// topology (the master's, replicas' and sentinels' addresses), the same for every tenant and
// no tenant's data; a per-namespace user would only add a revocation nobody needs (a tenant
// that loses its policies loses its data user, which is what reaches data) at the price of a
// user per namespace on every sentinel. Sentinel keeps ACL users per process and does not
// replicate them, so the manager sets it on every sentinel.
const SentinelReaderUser = "redline-sentinel-reader"

// sentinelReaderCommands are what a sidecar's FailoverClient sends to a sentinel: the
// handshake (HELLO with AUTH and SETNAME; AUTH and CLIENT SETNAME when HELLO is refused), PING
// (the Pub/Sub health check), SENTINEL get-master-addr-by-name, SENTINEL replicas (a client
// that reads from replicas, and redisconn's node listing), SENTINEL sentinels (discovering
// the other sentinels), and SUBSCRIBE to the channels of sentinelReaderChannels. Not SENTINEL
// slaves (go-redis sends replicas), nor MONITOR, REMOVE, SET, RESET, FAILOVER, CONFIG, DEBUG,
// IS-MASTER-DOWN-BY-ADDR, ACL, PUBLISH or PSUBSCRIBE: with any of them a tenant could point
// the group at a server of its own or stir failovers.
var sentinelReaderCommands = []string{
	"hello", "auth", "ping", "client|setname",
	"sentinel|get-master-addr-by-name", "sentinel|replicas", "sentinel|sentinels",
	"subscribe",
}

// sentinelReaderChannels are the channels the FailoverClient subscribes to (setSentinel).
var sentinelReaderChannels = []string{"+switch-master", "+replica-reconf-done"}

// SentinelReaderRules returns the ACL SETUSER rules of SentinelReaderUser holding password,
// without the user's name; "reset" first, so nothing it held before survives.
func SentinelReaderRules(password string) []string {
	// reset also resets channels: only those below are allowed.
	rules := []string{"reset", "on", ">" + password}
	for _, c := range sentinelReaderChannels {
		rules = append(rules, "&"+c)
	}
	for _, c := range sentinelReaderCommands {
		rules = append(rules, "+"+c)
	}
	return rules
}

// EnsureSentinelReader sets SentinelReaderUser on every sentinel with password, and asks each
// to write its config (SENTINEL FLUSHCONFIG) so that the user survives the sentinel's restart.
// A sentinel that refuses ACL commands is ErrUnavailable.
func EnsureSentinelReader(ctx context.Context, sentinels []Node, password string) error {
	if password == "" {
		return errors.New("setting the sentinel reader without a password")
	}
	args := []any{"acl", "setuser", SentinelReaderUser}
	for _, r := range SentinelReaderRules(password) {
		args = append(args, r)
	}
	return each(ctx, sentinels, func(ctx context.Context, n Node) error {
		if err := classify(n.Do(ctx, args...).Err()); err != nil {
			return err
		}
		// Without it the user lives in memory only: a restarted sentinel would refuse every
		// sidecar until the manager set it again. A refusal is not fatal; the user is set.
		_ = n.Do(ctx, "sentinel", "flushconfig").Err()
		return nil
	})
}

// SentinelUnprotected says why the sentinels let someone who reaches them reconfigure the
// group, or "" when none does: a sentinel refuses ACL commands (so no reader user can be set
// and sidecars would need a credential that can do everything), or its default user is on
// with no password (anyone may SENTINEL MONITOR, REMOVE, FAILOVER). A network error is
// returned as an error, not as a reason.
func SentinelUnprotected(ctx context.Context, sentinels []Node) (string, error) {
	if err := Probe(ctx, sentinels); err != nil {
		if errors.Is(err, ErrUnavailable) {
			return "the sentinels refuse ACL commands (" + err.Error() + ")", nil
		}
		return "", fmt.Errorf("probing the sentinels' ACLs: %w", err)
	}
	open, err := OpenUsers(ctx, sentinels)
	if err != nil {
		return "", fmt.Errorf("reading the sentinels' users: %w", err)
	}
	if len(open) > 0 {
		return "a sentinel's user(s) " + strings.Join(open, ", ") + " need no password", nil
	}
	return "", nil
}
