package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/testutil/kubeletdir"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// These tests run the built binary, several processes against one real redis-server, as the
// pods of a scaled Deployment would.

var (
	binary string
	shared *redistest.Server
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if _, err := redistest.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the sidecar tests need a real redis-server:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "sidecar-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "sidecar")
	// Built as the Dockerfile builds it, so that what the tests and benchmarks measure (RSS
	// above all) is the shipped binary.
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: building the sidecar:", err)
		return 1
	}
	if shared, err = redistest.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting redis-server:", err)
		return 1
	}
	defer shared.Close()
	return m.Run()
}

// sidecar is one running sidecar process.
type sidecar struct {
	name        string
	cmd         *exec.Cmd
	proxy       string // base URL of the proxy face
	admin       string // base URL of the admin port
	check       string // base URL of the decision API
	grpc        string // host:port of the rate limit service
	logs        *syncBuffer
	exited      chan struct{}
	exitErr     error
	stopTimeout time.Duration
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is a namespace's mounted volumes: the policies directory and the labels file.
type env struct {
	configDir string
	labels    string
	namespace string
}

func newEnv(t testing.TB, app string) *env {
	t.Helper()
	e := &env{configDir: filepath.Join(t.TempDir(), "policies"), labels: filepath.Join(t.TempDir(), "podinfo", "labels"), namespace: "ns-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))}
	if err := os.MkdirAll(e.configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := kubeletdir.Write(filepath.Dir(e.labels), map[string][]byte{"labels": []byte(fmt.Sprintf("app=%q\npod-template-hash=\"abc\"\n", app))}); err != nil {
		t.Fatal(err)
	}
	return e
}

// write publishes a policies document the way kubelet updates a mounted ConfigMap.
func (e *env) write(t testing.TB, doc []byte) {
	t.Helper()
	if err := kubeletdir.Write(e.configDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		t.Fatal(err)
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

// start runs one sidecar and waits until it listens; waitReady also waits for /readyz.
func start(t testing.TB, name string, e *env, redisURL, upstream string, waitReady bool, extra ...string) *sidecar {
	t.Helper()
	return startBinary(t, binary, name, e, redisURL, upstream, waitReady, extra...)
}

// startBinary is start with another sidecar binary (a baseline build to compare with).
func startBinary(t testing.TB, bin, name string, e *env, redisURL, upstream string, waitReady bool, extra ...string) *sidecar {
	t.Helper()
	return launch(t, bin, name, e, redisURL, upstream, waitReady, nil, extra...)
}

// startWithEnv is start against the shared Redis, waiting for readiness, with more
// environment variables (NAME=value).
func startWithEnv(t testing.TB, name string, e *env, upstream string, environ []string, extra ...string) *sidecar {
	t.Helper()
	return launch(t, binary, name, e, shared.URL(), upstream, true, environ, extra...)
}

func launch(t testing.TB, bin, name string, e *env, redisURL, upstream string, waitReady bool, environ []string, extra ...string) *sidecar {
	t.Helper()
	s := &sidecar{name: name, logs: &syncBuffer{}, exited: make(chan struct{}), stopTimeout: 20 * time.Second}
	// Port 0 everywhere: the sidecar binds what the kernel gives and logs it ("listening"), so
	// no other process can take a port between the test choosing it and the sidecar binding it.
	const anyPort = "127.0.0.1:0"
	args := append([]string{
		"--listen=" + anyPort, "--upstream=" + upstream, "--admin-listen=" + anyPort, "--check-listen=" + anyPort, "--grpc-listen=" + anyPort,
		"--config-dir=" + e.configDir, "--pod-labels=" + e.labels, "--heartbeat-interval=500ms",
		// The test machine is shared and slow: a Redis answer late by scheduling is not an outage.
		"--redis-timeout=2s", "--log-level=debug",
	}, extra...)
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), "REDLINE_REDIS_URL="+redisURL, "POD_NAME="+name, "POD_NAMESPACE="+e.namespace, "REDLINE_REDIS_PASSWORD=")
	s.cmd.Env = append(s.cmd.Env, environ...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting sidecar %s: %v", name, err)
	}
	go func() { s.exitErr = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("logs of sidecar %s:\n%s", name, s.logs.String())
		}
	})
	s.readAddrs(t)
	path := "/healthz"
	if waitReady {
		path = "/readyz"
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(s.admin + path)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("sidecar %s exited (%v):\n%s", name, s.exitErr, s.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar %s not answering %s after 20s:\n%s", name, path, s.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readAddrs waits for the sidecar's "listening" line and takes the addresses it bound, on
// loopback where it bound every interface.
func (s *sidecar) readAddrs(t testing.TB) {
	t.Helper()
	local := func(addr string) string {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || addr == "" {
			return ""
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "127.0.0.1"
		}
		return net.JoinHostPort(host, port)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		for line := range strings.SplitSeq(s.logs.String(), "\n") {
			var l struct{ Msg, Proxy, Admin, Check, GRPC string }
			if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "listening" {
				continue
			}
			s.proxy, s.admin, s.check, s.grpc = "http://"+local(l.Proxy), "http://"+local(l.Admin), "http://"+local(l.Check), local(l.GRPC)
			return
		}
		select {
		case <-s.exited:
			t.Fatalf("sidecar %s exited (%v):\n%s", s.name, s.exitErr, s.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar %s logged no \"listening\" line after 20s:\n%s", s.name, s.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (s *sidecar) stop(t testing.TB) {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if s.exitErr != nil {
			t.Errorf("sidecar %s exited with %v after SIGTERM", s.name, s.exitErr)
		}
	case <-time.After(s.stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		t.Errorf("sidecar %s did not stop within %s of SIGTERM", s.name, s.stopTimeout)
	}
}

// metric returns the value of a sample line of /metrics (name with labels, as printed), or -1.
func (s *sidecar) metric(t testing.TB, sample string) float64 {
	t.Helper()
	resp, err := http.Get(s.admin + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", s.name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

var httpClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64},
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
