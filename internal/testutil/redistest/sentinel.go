package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel group settings. Sentinel marks a master down after DownAfter without a valid reply;
// with quorum 2 of 3 sentinels that takes one of them to notice and one more to agree, so a
// killed master is replaced in 2-3 s on loopback. The failover timeout also spaces a retried
// failover (twice the timeout), so a small one keeps a split vote from stalling a test.
const (
	// SentinelMasterName is the name the sentinels monitor the master under.
	SentinelMasterName = "mymaster"
	sentinelQuorum     = 2
	sentinelDownAfter  = 1000 * time.Millisecond
	sentinelFailover   = 3000 * time.Millisecond
	// ReplicationUser is the ACL user the replica authenticates to its master as. Disabling
	// it on the master (CutReplica) keeps the replica from resyncing.
	ReplicationUser = "repl"
	replicationPass = "repl-secret"
)

// Sentinel is a Redis Sentinel group on loopback: a master, a replica (--replicaof) and three
// sentinels (redis-server <conf> --sentinel), every one a real process.
//
// The replica replicates as its own ACL user, so that CutReplica can keep it from catching up;
// killing the master afterwards (Master().Stop(), a SIGKILL) makes Sentinel promote a replica
// that lacks every write made since the cut, which is how asynchronous replication loses
// writes in a failover. Sentinel refuses to promote a replica whose link has been down for
// longer than ten times down-after-milliseconds (10 s here) plus the time the master has been
// down, so kill the master within 10 s of CutReplica.
type Sentinel struct {
	master, replica *Server
	// password is the sentinels' default user's (SentinelOptions.Password) and dataPassword
	// the data servers' (SentinelOptions.DataPassword); "" for none.
	password, dataPassword string
	// Sentinels are the three sentinel processes; each has its own config file in its own
	// directory, since a sentinel rewrites its config as it learns the group.
	Sentinels []*Server
}

// StartSentinel starts the group and waits until the replica is in sync and every sentinel
// knows the master, the replica and the two other sentinels (SENTINEL CKQUORUM), so that a
// failover can happen from the moment it returns.
func StartSentinel() (*Sentinel, error) { return StartSentinelWith(SentinelOptions{}) }

// SentinelOptions change the group StartSentinelWith starts.
type SentinelOptions struct {
	// Password, when set, is the sentinels' requirepass (their default user's password, which
	// can run every command, ACL SETUSER included) and what they authenticate to each other
	// with (sentinel sentinel-pass). The helpers of Sentinel use it.
	Password string
	// DataPassword, when set, is the master's and the replica's requirepass, which the
	// sentinels monitor them with (sentinel auth-pass).
	DataPassword string
	// TLS, when set, makes every process of the group speak TLS only, with these files (one
	// certificate for all, as one node pair serves and dials): the data servers replicate over
	// TLS and the sentinels reach them and each other over it (tls-replication yes). URL is
	// then rediss+sentinel://.
	TLS *TLSServer
}

// StartSentinelWith is StartSentinel with opts.
func StartSentinelWith(opts SentinelOptions) (*Sentinel, error) {
	// Both data servers carry the replication user and the credentials to use it, so that
	// either can replicate from the other: the old master, restarted after a failover, is
	// turned into a replica of the promoted one by Sentinel.
	dataArgs := []string{
		"--user", ReplicationUser, "on", ">" + replicationPass, "+psync", "+replconf", "+ping",
		"--masteruser", ReplicationUser, "--masterauth", replicationPass,
	}
	if opts.DataPassword != "" {
		dataArgs = append(dataArgs, "--requirepass", opts.DataPassword)
	}
	g := &Sentinel{password: opts.Password, dataPassword: opts.DataPassword}
	var err error
	if g.master, err = start(opts.TLS, dataArgs); err != nil {
		return nil, fmt.Errorf("starting sentinel group master: %w", err)
	}
	replicaArgs := append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(g.master.Port)}, dataArgs...)
	if g.replica, err = start(opts.TLS, replicaArgs); err != nil {
		_ = g.Close()
		return nil, fmt.Errorf("starting sentinel group replica: %w", err)
	}
	for i := range 3 {
		s, err := startSentinelProcess(g.master.Port, opts)
		if err != nil {
			_ = g.Close()
			return nil, fmt.Errorf("starting sentinel %d: %w", i, err)
		}
		g.Sentinels = append(g.Sentinels, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.WaitReplicaInSync(ctx); err != nil {
		_ = g.Close()
		return nil, err
	}
	if err := g.waitReady(ctx); err != nil {
		_ = g.Close()
		return nil, err
	}
	return g, nil
}

// startSentinelProcess writes a sentinel config monitoring the master on masterPort and
// starts redis-server on it in sentinel mode; with a password, the sentinel requires it.
func startSentinelProcess(masterPort int, opts SentinelOptions) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	portLine := fmt.Sprintf("port %d", port)
	var tlsConfig *tls.Config
	if opts.TLS != nil {
		kv := opts.TLS.args(port, "")
		portLine = ""
		for i := 0; i < len(kv); i += 2 {
			portLine += kv[i] + " " + kv[i+1] + "\n"
		}
		if tlsConfig, err = opts.TLS.clientConfig(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("reading the TLS files of the sentinel: %w", err)
		}
	}
	text := fmt.Sprintf(`%s
bind 127.0.0.1
protected-mode no
daemonize no
loglevel notice
dir %s
sentinel monitor %s 127.0.0.1 %d %d
sentinel down-after-milliseconds %[3]s %[6]d
sentinel failover-timeout %[3]s %[7]d
sentinel parallel-syncs %[3]s 1
`, portLine, dir, SentinelMasterName, masterPort, sentinelQuorum,
		sentinelDownAfter.Milliseconds(), sentinelFailover.Milliseconds())
	if opts.Password != "" {
		text += fmt.Sprintf("requirepass %s\nsentinel sentinel-pass %s\n", opts.Password, opts.Password)
	}
	if opts.DataPassword != "" {
		text += fmt.Sprintf("sentinel auth-pass %s %s\n", SentinelMasterName, opts.DataPassword)
	}
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("writing sentinel config: %w", err)
	}
	s := &Server{Port: port, dir: dir, args: []string{conf, "--sentinel"}, tls: tlsConfig}
	if err := s.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Master is the server started as the master. After a failover it is the old master, not
// necessarily the one Sentinel names now (see MasterAddr).
func (g *Sentinel) Master() *Server { return g.master }

// Replica is the server started as the replica; Sentinel promotes it when Master dies.
func (g *Sentinel) Replica() *Server { return g.replica }

// SentinelAddrs returns host:port of every sentinel.
func (g *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		out[i] = s.Addr()
	}
	return out
}

// URL is the redis+sentinel:// URL of the group, as internal/redisconn parses it: every
// sentinel, then the master's name; rediss+sentinel:// for a TLS group.
func (g *Sentinel) URL() string {
	scheme := "redis+sentinel://"
	if g.master.tls != nil {
		scheme = "rediss+sentinel://"
	}
	return scheme + strings.Join(g.SentinelAddrs(), ",") + "/" + SentinelMasterName
}

// CutReplica keeps the replica from catching up: it disables the replication user on the
// master (ACL SETUSER off), so the replica can no longer authenticate, and kills the
// replica's link (CLIENT KILL USER). It returns once the master has no replica connected and
// the replica reports its link down; from then on, writes to the master are not replicated.
func (g *Sentinel) CutReplica(ctx context.Context) error {
	m := g.client(g.master)
	defer m.Close()
	if err := m.Do(ctx, "ACL", "SETUSER", ReplicationUser, "off").Err(); err != nil {
		return fmt.Errorf("disabling replication user on %s: %w", g.master.Addr(), err)
	}
	if err := m.Do(ctx, "CLIENT", "KILL", "USER", ReplicationUser).Err(); err != nil {
		return fmt.Errorf("killing replication link on %s: %w", g.master.Addr(), err)
	}
	r := g.client(g.replica)
	defer r.Close()
	for {
		mi, merr := m.Info(ctx, "replication").Result()
		ri, rerr := r.Info(ctx, "replication").Result()
		if merr == nil && rerr == nil && strings.Contains(mi, "connected_slaves:0") &&
			strings.Contains(ri, "master_link_status:down") {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the replica %s to lose its link: %w (master: %v, replica: %v)",
				g.replica.Addr(), err, merr, rerr)
		}
	}
}

// RestoreReplica enables the replication user on the master again, so the replica resyncs.
func (g *Sentinel) RestoreReplica(ctx context.Context) error {
	m := g.client(g.master)
	defer m.Close()
	if err := m.Do(ctx, "ACL", "SETUSER", ReplicationUser, "on").Err(); err != nil {
		return fmt.Errorf("enabling replication user on %s: %w", g.master.Addr(), err)
	}
	return nil
}

// WaitReplicaInSync waits until the replica's link to the master is up and it has applied
// every write the master had made when the call began (its replication offset reached the
// master's).
func (g *Sentinel) WaitReplicaInSync(ctx context.Context) error {
	m, r := g.client(g.master), g.client(g.replica)
	defer m.Close()
	defer r.Close()
	var target int64 = -1
	var last error
	for {
		if target < 0 {
			info, err := m.Info(ctx, "replication").Result()
			if n, ok := infoInt(info, "master_repl_offset"); err == nil && ok {
				target = n
			}
			last = err
		}
		if target >= 0 {
			info, err := r.Info(ctx, "replication").Result()
			n, ok := infoInt(info, "slave_repl_offset")
			if err == nil && ok && n >= target && strings.Contains(info, "master_link_status:up") {
				return nil
			}
			last = fmt.Errorf("replica at offset %d (link up: %t), master was at %d: %v",
				n, strings.Contains(info, "master_link_status:up"), target, err)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for replica %s to be in sync with %s: %w (last: %v)",
				g.replica.Addr(), g.master.Addr(), err, last)
		}
	}
}

// infoInt reads an integer field of an INFO reply.
func infoInt(info, field string) (int64, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// MasterAddr asks every sentinel which master it names (SENTINEL get-master-addr-by-name) and
// returns the address if all agree; otherwise it returns an error saying who says what.
func (g *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var addrs []string
	for _, s := range g.Sentinels {
		sc := g.SentinelClient(s)
		hp, err := sc.GetMasterAddrByName(ctx, SentinelMasterName).Result()
		_ = sc.Close()
		if err != nil {
			return "", fmt.Errorf("asking sentinel %s for the master: %w", s.Addr(), err)
		}
		if len(hp) != 2 {
			return "", fmt.Errorf("sentinel %s answered %q for the master", s.Addr(), hp)
		}
		addrs = append(addrs, hp[0]+":"+hp[1])
	}
	for _, a := range addrs[1:] {
		if a != addrs[0] {
			return "", fmt.Errorf("sentinels disagree on the master: %v", addrs)
		}
	}
	return addrs[0], nil
}

// WaitMaster waits until every sentinel names srv as the master and srv itself says it is
// one (ROLE), which is when a client that asks any sentinel is sent to srv and can write.
func (g *Sentinel) WaitMaster(ctx context.Context, srv *Server) error {
	c := g.client(srv)
	defer c.Close()
	var last error
	for {
		addr, err := g.MasterAddr(ctx)
		switch {
		case err != nil:
			last = err
		case addr != srv.Addr():
			last = fmt.Errorf("sentinels name %s", addr)
		default:
			role, err := c.Do(ctx, "ROLE").Slice()
			if err == nil && len(role) > 0 && role[0] == "master" {
				return nil
			}
			last = fmt.Errorf("%s answers ROLE %v: %v", srv.Addr(), role, err)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for %s to be the master: %w (last: %v)", srv.Addr(), err, last)
		}
	}
}

// waitReady waits until every sentinel sees the replica (and not as down), knows both other
// sentinels, and finds the quorum and the majority to authorize a failover reachable.
func (g *Sentinel) waitReady(ctx context.Context) error {
	var last error
	for {
		last = g.ready(ctx)
		if last == nil {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the sentinels to be ready: %w (last: %v)", err, last)
		}
	}
}

func (g *Sentinel) ready(ctx context.Context) error {
	for _, s := range g.Sentinels {
		sc := g.SentinelClient(s)
		err := sentinelReady(ctx, sc, g.replica.Port, len(g.Sentinels)-1)
		_ = sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr(), err)
		}
	}
	return nil
}

func sentinelReady(ctx context.Context, sc *redis.SentinelClient, replicaPort, others int) error {
	if err := sc.CkQuorum(ctx, SentinelMasterName).Err(); err != nil {
		return fmt.Errorf("ckquorum: %w", err)
	}
	peers, err := sc.Sentinels(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("listing sentinels: %w", err)
	}
	if len(peers) < others {
		return fmt.Errorf("knows %d other sentinels, want %d", len(peers), others)
	}
	replicas, err := sc.Replicas(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("listing replicas: %w", err)
	}
	for _, r := range replicas {
		if r["port"] == strconv.Itoa(replicaPort) {
			if r["flags"] != "slave" || r["master-link-status"] != "ok" {
				return fmt.Errorf("sees replica :%d with flags %q, link %q", replicaPort, r["flags"], r["master-link-status"])
			}
			return nil
		}
	}
	return fmt.Errorf("does not know replica :%d yet", replicaPort)
}

// SentinelClient is a client to sentinel s as its admin (the default user, with the group's
// password if any).
func (g *Sentinel) SentinelClient(s *Server) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), Password: g.password, MaxRetries: -1, TLSConfig: s.tls})
}

// Password is the sentinels' admin password ("" when they have none).
func (g *Sentinel) Password() string { return g.password }

func (g *Sentinel) client(s *Server) *redis.Client {
	return s.Client(g.dataPassword)
}

// Close stops every process and removes their directories.
func (g *Sentinel) Close() error {
	var errs []error
	for _, s := range g.Sentinels {
		errs = append(errs, s.Close())
	}
	for _, s := range []*Server{g.master, g.replica} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
