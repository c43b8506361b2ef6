package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/proc"
)

// hostRedis is a redis-server on the host, bound to the cluster's bridge only: pods reach it at
// the node's address, nothing outside the machine does, and other suites' loopback Redis
// servers are not in its way.
type hostRedis struct {
	proc     *proc.Process
	dir      string
	password string
	client   *redis.Client
}

func (r *hostRedis) url() string { return "redis://" + nodeIP + ":" + redisPort }

func startHostRedis() (*hostRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found: apt-get install redis-server: %w", err)
	}
	buf := make([]byte, 24)
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("a Redis password: %w", err)
	}
	dir := filepath.Join(suite.scratch, "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("Redis's directory: %w", err)
	}
	r := &hostRedis{dir: dir, password: hex.EncodeToString(buf)}
	r.proc, err = proc.Start(dir, "redis-server", bin, []string{"--bind", nodeIP, "--port", redisPort,
		"--save", "", "--appendonly", "no", "--dir", dir, "--requirepass", r.password, "--maxclients", "1000"}, nil)
	if err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	r.client = redis.NewClient(&redis.Options{Addr: nodeIP + ":" + redisPort, Password: r.password})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if err := r.client.Ping(ctx).Err(); err == nil {
			return r, nil
		} else if ctx.Err() != nil {
			tail := r.proc.LogTail(2000)
			_ = r.stop()
			return nil, fmt.Errorf("redis-server on %s:%s not answering: %w\n%s", nodeIP, redisPort, err, tail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *hostRedis) stop() error {
	_ = r.client.Close()
	if err := r.proc.Stop(10 * time.Second); err != nil {
		return fmt.Errorf("stopping redis-server: %w", err)
	}
	return os.RemoveAll(r.dir)
}
