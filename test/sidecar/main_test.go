package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
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
	// Built as the Dockerfile builds it, so that what the tests and benchmarks measure (RSS
	// above all) is the shipped binary.
	if binary, err = sidecarproc.Build(context.Background(), filepath.Join("..", ".."), dir); err != nil {
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

// sidecar is one running sidecar process, started by the shared launcher.
type sidecar struct {
	*sidecarproc.Sidecar
	name  string
	proxy string // base URL of the proxy face
	admin string // base URL of the admin port
	check string // base URL of the decision API
	grpc  string // host:port of the rate limit service
}

// exitErr is how the process ended, once Done is closed.
func (s *sidecar) exitErr() error {
	_, err := s.Exited()
	return err
}

// env is a namespace's mounted volumes: the policies directory and the labels file.
type env struct {
	configDir string
	labels    string
	namespace string
}

// envRuns counts newEnv's runs of each test, by name (*atomic.Int64).
var envRuns sync.Map

func newEnv(t testing.TB, app string) *env {
	t.Helper()
	ns := "ns-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	// What a run leaves in the shared Redis (a window's log, a slot's place) outlives it: the
	// same test run again in this process (-count) gets a namespace of its own.
	runs, _ := envRuns.LoadOrStore(t.Name(), new(atomic.Int64))
	if run := runs.(*atomic.Int64).Add(1); run > 1 {
		ns += "-" + strconv.FormatInt(run, 10)
	}
	e := &env{configDir: filepath.Join(t.TempDir(), "policies"), labels: filepath.Join(t.TempDir(), "podinfo", "labels"), namespace: ns}
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

// stopGrace is how long a sidecar has to exit after SIGTERM before the test fails.
const stopGrace = 20 * time.Second

func launch(t testing.TB, bin, name string, e *env, redisURL, upstream string, waitReady bool, environ []string, extra ...string) *sidecar {
	t.Helper()
	ready := "/healthz"
	if waitReady {
		ready = "/readyz"
	}
	sc, err := sidecarproc.Start(context.Background(), sidecarproc.Options{
		Bin: bin, Dir: t.TempDir(), Name: name, Namespace: e.namespace,
		Files: sidecarproc.Files{ConfigDir: e.configDir, Labels: e.labels}, RedisURL: redisURL, Upstream: upstream,
		// Port 0 everywhere: no other process can take a port between the test choosing it and
		// the sidecar binding it.
		AnyPort: true, ReadyPath: ready,
		Args: append([]string{"--heartbeat-interval=500ms",
			// The test machine is shared and slow: a Redis answer late by scheduling is not an outage.
			"--redis-timeout=2s", "--log-level=debug"}, extra...),
		Env: append([]string{"REDLINE_REDIS_PASSWORD="}, environ...),
	})
	if err != nil {
		t.Fatalf("starting sidecar %s: %v", name, err)
	}
	s := &sidecar{Sidecar: sc, name: name, proxy: "http://" + sc.Proxy, admin: "http://" + sc.Admin, check: "http://" + sc.Check, grpc: sc.GRPC}
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("logs of sidecar %s:\n%s", name, s.Log())
		}
	})
	return s
}

// stop sends SIGTERM and waits for a clean exit.
func (s *sidecar) stop(t testing.TB) {
	select {
	case <-s.Done():
		return
	default:
	}
	_ = s.Signal(syscall.SIGTERM)
	select {
	case <-s.Done():
		if err := s.exitErr(); err != nil {
			t.Errorf("sidecar %s exited with %v after SIGTERM", s.name, err)
		}
	case <-time.After(stopGrace):
		_ = s.Kill()
		t.Errorf("sidecar %s did not stop within %s of SIGTERM", s.name, stopGrace)
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
