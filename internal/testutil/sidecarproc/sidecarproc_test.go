package sidecarproc

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func TestScrape(t *testing.T) {
	g := NewWithT(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "# HELP a_total x\na_total 12\nb_total{p=\"x\"} 3\nb_total 4.5\n")
	}))
	defer srv.Close()
	m, err := Scrape(context.Background(), srv.URL, "a_total", "b_total")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).To(Equal(map[string]float64{"a_total": 12, "b_total": 4.5}), "labelled samples are other series")
	_, err = Scrape(context.Background(), srv.URL, "a_total", "c_total")
	g.Expect(err).To(MatchError(ContainSubstring("metric c_total missing")))
}

func TestCPUTime(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("CPUTime of this process: %v", err)
	}
	// Spin until the kernel's own account (getrusage) says this process used 100ms more CPU:
	// wall time would say nothing on a loaded machine, where 100ms of it can be 20ms of CPU.
	ref := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatalf("getrusage: %v", err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for start := ref(); ref()-start < 100*time.Millisecond; {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("CPUTime of this process: %v", err)
	}
	if after-before < 80*time.Millisecond { // /proc counts in clock ticks (10ms)
		t.Errorf("100ms of CPU by getrusage counted %s by CPUTime", after-before)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

// TestStartRunsTheSidecarUntilStopped builds the sidecar, starts it against a real
// redis-server and asks it for decisions: every face's address is its own, the policies and
// labels files are read, and Stop ends it cleanly (SIGTERM, exit status 0).
func TestStartRunsTheSidecarUntilStopped(t *testing.T) {
	g := NewWithT(t)
	bin := build(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	defer srv.Close()
	dir := t.TempDir()
	files := writeFiles(t, dir, 2)
	ctx := context.Background()
	sc, err := Start(ctx, Options{Bin: bin, Dir: filepath.Join(dir, "logs"), Name: "start-0", Namespace: "ns",
		Files: files, RedisURL: srv.URL()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = sc.Kill() }()
	g.Expect([]string{sc.Proxy, sc.Check, sc.GRPC}).NotTo(ContainElement(sc.Admin))

	var allowed []bool
	for range 3 {
		allowed = append(allowed, check(t, sc.Check))
	}
	g.Expect(allowed).To(Equal([]bool{true, true, false}), "the policy's limit of 2, counted in Redis")
	m, err := Scrape(ctx, "http://"+sc.Admin+"/metrics", "redline_sidecar_redis_decisions_total")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m["redline_sidecar_redis_decisions_total"]).To(BeNumerically(">=", 1))

	g.Expect(sc.Stop(30 * time.Second)).To(Succeed())
	done, exitErr := sc.Exited()
	g.Expect(done).To(BeTrue())
	g.Expect(exitErr).NotTo(HaveOccurred(), "a clean shutdown on SIGTERM; log:\n%s", sc.LogTail(2000))
}

// With AnyPort every face binds port 0 and Start takes the addresses the kernel gave from the
// sidecar's "listening" line: each face answers on its own, and the environment of Env reaches
// the process.
func TestStartWithAnyPortReadsTheBoundAddresses(t *testing.T) {
	g := NewWithT(t)
	bin := build(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	defer srv.Close()
	dir := t.TempDir()
	sc, err := Start(context.Background(), Options{Bin: bin, Dir: filepath.Join(dir, "logs"), Name: "any-0", Namespace: "ns",
		Files: writeFiles(t, dir, 1), RedisURL: srv.URL(), AnyPort: true, ReadyPath: "/healthz", Env: []string{"GOMAXPROCS=2"}})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = sc.Kill() }()
	addrs := []string{sc.Proxy, sc.Admin, sc.Check, sc.GRPC}
	for _, a := range addrs {
		g.Expect(a).To(HavePrefix("127.0.0.1:"))
		g.Expect(a).NotTo(HaveSuffix(":0"))
	}
	g.Expect(slices.Compact(slices.Sorted(slices.Values(addrs)))).To(HaveLen(4), "a port per face")
	g.Expect(check(t, sc.Check)).To(BeTrue())
	g.Expect(sc.Log()).To(ContainSubstring(`"msg":"listening"`))
	g.Expect(sc.Log()).To(ContainSubstring(`"maxProcs":2`), "GOMAXPROCS from Env")
	g.Expect(sc.Stop(30 * time.Second)).To(Succeed())
	<-sc.Done()
	_, exitErr := sc.Exited()
	g.Expect(exitErr).NotTo(HaveOccurred())
}

// A sidecar that cannot start is reported with the end of its log, at once.
func TestStartReportsASidecarThatExits(t *testing.T) {
	g := NewWithT(t)
	bin := build(t)
	dir := t.TempDir()
	_, err := Start(context.Background(), Options{Bin: bin, Dir: dir, Name: "bad", Namespace: "ns",
		Files: writeFiles(t, dir, 1), RedisURL: "redis://127.0.0.1:1", Args: []string{"--no-such-flag"}})
	g.Expect(err).To(MatchError(ContainSubstring("bad exited (exit status 2)")))
	g.Expect(err).To(MatchError(ContainSubstring("no-such-flag")), "the sidecar's own words, from its log")
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// build compiles ./cmd/sidecar once for the package's tests.
func build(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "sidecarproc-test-"); built.err == nil {
			built.bin, built.err = Build(context.Background(), "../../..", built.dir)
		}
	})
	if built.err != nil {
		t.Fatalf("building the sidecar: %v", built.err)
	}
	return built.bin
}

// writeFiles writes a policy of one FixedWindow rule, limit per minute, keyed on header k.
func writeFiles(t *testing.T, dir string, limit int64) Files {
	t.Helper()
	p := policydoc.Policy{Name: "p", Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "a"}},
		FailureMode: "Closed", Rules: []policydoc.Rule{{Name: "r", Key: []policydoc.KeyPart{{Header: "k"}},
			Algorithm: "FixedWindow", Requests: limit, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}}}
	_, doc, err := policydoc.Build("ns", []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := WriteFiles(filepath.Join(dir, "files"), doc, "a")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// check asks the decision API for one unit of rule p/r, key "one".
func check(t *testing.T, addr string) bool {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
		strings.NewReader(`{"policy":"p","rule":"r","key":["one"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Allowed bool }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decoding /v1/check (status %s): %v", resp.Status, err)
	}
	return out.Allowed
}
