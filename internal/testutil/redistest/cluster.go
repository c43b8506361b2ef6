package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster, each node a redis-server on a loopback port: masters only
// (StartCluster) or a replica per master (StartClusterWithReplicas).
type Cluster struct {
	Nodes []*Server
	// password is every node's requirepass and masterauth (ClusterOptions.Password), "" for none.
	password string
}

// ClusterOptions change the cluster StartClusterWith starts.
type ClusterOptions struct {
	// Masters is the number of masters (at least 3); Replicas the replicas of each (0 or 1).
	Masters, Replicas int
	// Password, when set, is every node's requirepass, and the masterauth a replica
	// authenticates to its master with: Redis's default user then needs it, as in an
	// installation whose admin alone holds it. redis-cli and the helpers of Cluster use it.
	Password string
}

// StartClusterWith starts o.Masters cluster-enabled redis-servers with o.Replicas (0 or 1)
// each, as `redis-cli --cluster create --cluster-replicas` lays them out, and waits until every
// node reports cluster_state:ok and every replica is in sync.
func StartClusterWith(o ClusterOptions) (*Cluster, error) {
	if o.Replicas < 0 || o.Replicas > 1 {
		return nil, fmt.Errorf("starting redis cluster: want 0 or 1 replicas a master, got %d", o.Replicas)
	}
	return startClusterWith(o.Masters, o.Replicas, nil, o.Password)
}

// StartCluster starts n (at least 3) cluster-enabled redis-servers, joins them with
// `redis-cli --cluster create`, and waits until every node reports cluster_state:ok.
func StartCluster(n int) (*Cluster, error) { return startCluster(n, 0) }

// StartClusterTLS is StartCluster for nodes that speak TLS only, to clients and on the
// cluster bus (tls-cluster yes), every one with the certificate of t.
func StartClusterTLS(n int, t TLSServer) (*Cluster, error) { return startClusterWith(n, 0, &t, "") }

// startCluster starts masters cluster-enabled redis-servers with replicas (0 or 1) each, as
// `redis-cli --cluster create --cluster-replicas` lays them out, and waits until every node
// reports cluster_state:ok and every replica is in sync.
func startCluster(masters, replicas int) (*Cluster, error) {
	return startClusterWith(masters, replicas, nil, "")
}

func startClusterWith(masters, replicas int, t *TLSServer, password string) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("starting redis cluster: need at least 3 masters, got %d", masters)
	}
	cli, err := CLIBinary()
	if err != nil {
		return nil, err
	}
	c := &Cluster{password: password}
	for i := range masters * (1 + replicas) {
		args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}
		if t != nil {
			args = append(args, "--tls-cluster", "yes")
		}
		if password != "" {
			args = append(args, "--requirepass", password, "--masterauth", password)
		}
		s, err := start(t, args)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("starting cluster node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if t != nil {
		args = append(args, "--tls", "--cacert", t.CAFile, "--cert", t.CertFile, "--key", t.KeyFile)
	}
	cmd := exec.Command(cli, args...)
	if password != "" {
		// REDISCLI_AUTH, not -a: the password stays out of the process list.
		cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+password)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("creating cluster with redis-cli: %w\n%s", err, out)
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		_ = c.Close()
		return nil, err
	}
	want := masters * replicas
	for deadline := time.Now().Add(30 * time.Second); c.replicasInSync() < want; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = c.Close()
			return nil, fmt.Errorf("redis cluster: %d of %d replicas in sync after 30s", c.replicasInSync(), want)
		}
	}
	return c, nil
}

// Addrs returns host:port of every node.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// URL is a redis:// URL listing every node as a seed, comma-separated (rediss:// for a TLS
// cluster).
func (c *Cluster) URL() string {
	if len(c.Nodes) > 0 && c.Nodes[0].tls != nil {
		return "rediss://" + strings.Join(c.Addrs(), ",")
	}
	return "redis://" + strings.Join(c.Addrs(), ",")
}

// Password is every node's requirepass ("" for none).
func (c *Cluster) Password() string { return c.password }

// Client is a client of the one node at addr, as the admin (the default user, with Password).
func (c *Cluster) Client(addr string) *redis.Client {
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s.Client(c.password)
		}
	}
	return redis.NewClient(&redis.Options{Addr: addr, Password: c.password, MaxRetries: -1})
}

// Close stops every node and removes their directories.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Nodes {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

func (c *Cluster) waitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, s := range c.Nodes {
			rc := s.Client(c.password)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := rc.ClusterInfo(ctx).Result()
			cancel()
			_ = rc.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok, last = false, fmt.Sprintf("%s: %v %s", s.Addr(), err, firstLine(info))
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("redis cluster not ok after %s: %s", timeout, last)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

// CLIBinary returns the path of redis-cli, or an error that says how to install it.
func CLIBinary() (string, error) {
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", errors.New("redis-cli not found on PATH: install it (apt-get install redis-tools or redis-server)")
	}
	return p, nil
}

// StartClusterWithReplicas starts masters (at least 3) cluster-enabled redis-servers with one
// replica each, and waits until every node reports cluster_state:ok and every replica is in sync.
func StartClusterWithReplicas(masters int) (*Cluster, error) { return startCluster(masters, 1) }

// replicasInSync counts the nodes that are replicas with their link to the master up.
func (c *Cluster) replicasInSync() int {
	n := 0
	for _, s := range c.Nodes {
		rc := s.Client(c.password)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rc.Info(ctx, "replication").Result()
		cancel()
		_ = rc.Close()
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") {
			n++
		}
	}
	return n
}

// ReplicaOf returns the node that replicates the master at addr.
func (c *Cluster) ReplicaOf(addr string) (*Server, error) {
	for _, s := range c.Nodes {
		rc := s.Client(c.password)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rc.Info(ctx, "replication").Result()
		cancel()
		_ = rc.Close()
		if err != nil {
			continue
		}
		host, port, _ := strings.Cut(addr, ":")
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port) &&
			strings.Contains(info, "master_host:"+host) && strings.Contains(info, "master_link_status:up") {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no replica of %s in sync", addr)
}

// CutClusterReplica keeps a cluster replica from catching up: it makes the replica
// authenticate to its master as a user that does not exist, kills its link, and waits until
// the master has no replica and the replica reports its link down.
func CutClusterReplica(ctx context.Context, mc, rc *redis.Client) error {
	if err := rc.ConfigSet(ctx, "masteruser", "nobody").Err(); err != nil {
		return fmt.Errorf("setting masteruser on the replica: %w", err)
	}
	if err := rc.ConfigSet(ctx, "masterauth", "wrong").Err(); err != nil {
		return fmt.Errorf("setting masterauth on the replica: %w", err)
	}
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		return fmt.Errorf("killing the replication link: %w", err)
	}
	for {
		mi, merr := mc.Info(ctx, "replication").Result()
		ri, rerr := rc.Info(ctx, "replication").Result()
		if merr == nil && rerr == nil && strings.Contains(mi, "connected_slaves:0") &&
			strings.Contains(ri, "master_link_status:down") {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the replica to lose its link: %w (master: %v, replica: %v)", err, merr, rerr)
		}
	}
}
