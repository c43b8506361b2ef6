// Package redistest starts real redis-server processes on loopback ports for tests.
package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/proc"
)

// Server is one redis-server process on a loopback port. Stop and Start keep the port, so
// clients reconnect to the same address after a restart.
type Server struct {
	Port int
	dir  string
	proc *proc.Process // nil while it is not running
	args []string
	env  []string // the process's environment beyond none (StartAt's clock shift)
	bin  string   // the server binary (StartValkey); empty: Binary's redis-server
	// tls is how the helper's own clients reach a TLS server (StartTLS); nil for plaintext.
	tls *tls.Config
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Pid is the server process's id, 0 while it is not running.
func (s *Server) Pid() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid()
}

// URL is the redis:// URL of the server, rediss:// for one started with StartTLS.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Client is a client to the server as its default user, over TLS for a TLS server (trusting
// its CA, presenting its certificate).
func (s *Server) Client(password string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), Password: password, MaxRetries: -1, TLSConfig: s.tls})
}

// FreePort returns a TCP port free on every address, below the kernel's ephemeral range.
func FreePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	// Below the kernel's ephemeral range, with the cluster bus port (port + 10000) too: a port
	// the kernel hands out for :0 is also the local port of the next outgoing connection, which
	// can take it between this check and the listener's bind ("address already in use").
	lo, hi := 12000, min(ephemeralLow()-10000, 22768)
	for range 500 {
		p := lo + rand.IntN(hi-lo)
		if portsGiven[p] || !canListen(p) || !canListen(p+clusterBusOffset) {
			continue
		}
		portsGiven[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d below the ephemeral range", lo, hi)
}

// clusterBusOffset is where Redis Cluster puts a node's bus port.
const clusterBusOffset = 10000

var (
	portMu     sync.Mutex
	portsGiven = map[int]bool{} // never the same port twice in one process
)

// canListen says whether port is free on every address.
func canListen(port int) bool {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 22768 {
		return 32768
	}
	return n
}

// Binary returns the path of redis-server, or an error that says how to install it.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found on PATH: install it (apt-get install redis-server) or set REDIS_SERVER; .ci/run does this")
	}
	return p, nil
}

// ValkeyBinary returns the path of valkey-server, or an error that says how to install it.
// Valkey 8 is the server of this machine's packages that has what Redis 7.2 added (WAITAOF):
// Debian 12's redis-server is 7.0.
func ValkeyBinary() (string, error) {
	if p := os.Getenv("VALKEY_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("valkey-server")
	if err != nil {
		return "", errors.New("valkey-server not found on PATH: install it (apt-get install -t bookworm-backports valkey-server) or set VALKEY_SERVER; .ci/run does this")
	}
	return p, nil
}

// Start launches a redis-server on a free loopback port with no persistence. Extra arguments
// are passed as config directives (e.g. "--cluster-enabled", "yes").
func Start(extra ...string) (*Server, error) { return start(nil, extra) }

// StartValkey is Start with valkey-server (ValkeyBinary) instead of redis-server.
func StartValkey(extra ...string) (*Server, error) {
	bin, err := ValkeyBinary()
	if err != nil {
		return nil, err
	}
	return startBin(bin, nil, nil, extra)
}

// TLSServer is the TLS setup of a server StartTLS starts: its certificate, which it also
// presents when it dials another node (replication, Sentinel), and the CA it verifies clients
// and the nodes it dials with.
type TLSServer struct {
	CertFile, KeyFile, CAFile string
	// AuthClients makes the server require a client certificate (tls-auth-clients yes).
	AuthClients bool
	// ServerName is the name the helper's own clients verify in the certificate (empty: the
	// address they dial, 127.0.0.1).
	ServerName string
}

// args are the server's TLS directives, for a command line (prefix "--") or a config file
// (prefix ""), with the TLS port port and no plaintext port.
func (t TLSServer) args(port int, prefix string) []string {
	auth := "no"
	if t.AuthClients {
		auth = "yes"
	}
	kv := []string{"port", "0", "tls-port", strconv.Itoa(port), "tls-cert-file", t.CertFile, "tls-key-file", t.KeyFile,
		"tls-ca-cert-file", t.CAFile, "tls-auth-clients", auth, "tls-replication", "yes"}
	for i := 0; i < len(kv); i += 2 {
		kv[i] = prefix + kv[i]
	}
	return kv
}

// clientConfig is how the helper's own clients reach such a server: trusting its CA and
// presenting its certificate (issued for serving and dialing both).
func (t TLSServer) clientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", t.CAFile)
	}
	pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, ServerName: t.ServerName, MinVersion: tls.VersionTLS12}, nil
}

// StartTLS is Start for a server that speaks TLS only, on its port (no plaintext port), with
// tls-replication on: a replica of it (--replicaof) dials its master over TLS.
func StartTLS(t TLSServer, extra ...string) (*Server, error) { return start(&t, extra) }

func start(t *TLSServer, extra []string) (*Server, error) { return startTLSEnv(t, nil, extra) }

func startEnv(env, extra []string) (*Server, error) { return startTLSEnv(nil, env, extra) }

func startTLSEnv(t *TLSServer, env, extra []string) (*Server, error) {
	return startBin("", t, env, extra)
}

// startBin starts bin (empty: Binary's redis-server).
func startBin(bin string, t *TLSServer, env, extra []string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, dir: dir, env: env, bin: bin}
	portArgs := []string{"--port", strconv.Itoa(port)}
	if t != nil {
		if s.tls, err = t.clientConfig(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("reading the TLS files of redis-server: %w", err)
		}
		portArgs = t.args(port, "--")
	}
	s.args = append(append(portArgs,
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
	), extra...)
	if err := s.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Start (re)starts the process on the same port and waits until it answers PING.
func (s *Server) Start() error {
	if s.proc != nil {
		return errors.New("redis-server already running")
	}
	bin := s.bin
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return err
		}
	}
	// Killed with the test binary, even by a timeout's SIGKILL: no servers left behind. The log
	// (redis.log) is appended to, so a restarted server's keeps the earlier runs'.
	p, err := proc.Start(s.dir, "redis", bin, s.args, s.env)
	if err != nil {
		return err
	}
	s.proc = p

	c := s.Client("")
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if done, _ := p.Exited(); done {
			s.proc = nil
			return fmt.Errorf("redis-server on %s: %w", s.Addr(), p.ExitError())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		// A server that needs a password ("--requirepass", ACL users) answers NOAUTH: it is up.
		if err == nil || redis.HasErrorPrefix(err, "NOAUTH") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = s.Stop()
	log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return fmt.Errorf("redis-server on %s did not answer PING within 10s: %v\n%s", s.Addr(), err, log)
}

// Stop kills the process (SIGKILL: a crash, not a clean shutdown) and waits until the port is free.
func (s *Server) Stop() error {
	if s.proc == nil {
		return nil
	}
	err := s.proc.Kill()
	s.proc = nil
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err != nil {
			return nil
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s still accepting after kill", s.Addr())
}

// Log is what the server has logged so far (level warning: errors, such as a client's TLS
// handshake that failed, and a replica's or a cluster's state changes).
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// Pause freezes the process (SIGSTOP): connections stay open but nothing answers, like a Redis
// stuck in a long command or behind a dead network path.
func (s *Server) Pause() error {
	if s.proc == nil {
		return errors.New("redis-server not running")
	}
	return s.proc.Signal(syscall.SIGSTOP)
}

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() error {
	if s.proc == nil {
		return errors.New("redis-server not running")
	}
	return s.proc.Signal(syscall.SIGCONT)
}

// Close stops the server and removes its directory.
func (s *Server) Close() error {
	err := s.Stop()
	_ = os.RemoveAll(s.dir)
	return err
}
