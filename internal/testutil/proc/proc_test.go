package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// childEnv selects what this test binary does when it runs as the child process of a test.
const childEnv = "PROC_TEST_CHILD"

// TestMain lets the tests start this very binary as their child: a real process with
// behaviour each test picks, and nothing to install.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// say writes a line of the child's output, which its log receives.
func say(format string, args ...any) { _, _ = fmt.Fprintf(os.Stdout, format+"\n", args...) }

// child runs one behaviour and returns the exit code.
func child(mode string) int {
	switch mode {
	case "env":
		say("X=%s HOME=%s", os.Getenv("X"), os.Getenv("HOME"))
		return 0
	case "fail":
		for i := range 500 {
			say("line %d", i)
		}
		say("bad configuration")
		return 3
	case "term": // ends cleanly on SIGTERM, saying so
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		say("ready")
		<-c
		say("terminated")
		return 0
	case "deaf": // ignores SIGTERM
		signal.Ignore(syscall.SIGTERM)
		say("ready")
		time.Sleep(time.Hour)
		return 0
	case "parent": // starts a grandchild that ignores SIGTERM, prints its pid, waits
		signal.Ignore(syscall.SIGTERM)
		gc := exec.Command(os.Args[0])
		gc.Env = append(os.Environ(), childEnv+"=deaf")
		if err := gc.Start(); err != nil {
			say("%v", err)
			return 1
		}
		say("grandchild %d", gc.Process.Pid)
		_ = gc.Wait()
		return 0
	case "serve": // 503 for the first three requests, then 200
		ln, err := net.Listen("tcp", os.Getenv("ADDR"))
		if err != nil {
			say("%v", err)
			return 1
		}
		var n atomic.Int64
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if n.Add(1) <= 3 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
		return 1
	case "unready": // 503 for ever
		_ = http.ListenAndServe(os.Getenv("ADDR"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		return 1
	}
	say("unknown mode %s", mode)
	return 2
}

// start runs this binary as a child in mode, with extra environment.
func start(t *testing.T, mode string, env ...string) *Process {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A binary built for coverage (make test's -coverprofile) warns on exit without GOCOVERDIR,
	// which would be part of the child's log.
	p, err := Start(t.TempDir(), mode, bin, nil, append([]string{childEnv + "=" + mode, "GOCOVERDIR=" + t.TempDir()}, env...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestTheProcessSeesExactlyItsEnvironment(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("HOME", "/somewhere")
	p := start(t, "env", "X=1")
	g.Eventually(func() bool { done, _ := p.Exited(); return done }).Should(BeTrue())
	_, err := p.Exited()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.LogTail(100)).To(Equal("X=1 HOME=\n"), "HOME is not passed on")
}

func TestStopEndsTheProcessWithSIGTERM(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "term")
	g.Eventually(func() string { return p.LogTail(100) }).Should(ContainSubstring("ready"))
	g.Expect(p.Stop(time.Minute)).To(Succeed())
	done, err := p.Exited()
	g.Expect(done).To(BeTrue())
	g.Expect(err).NotTo(HaveOccurred(), "it ended on its own after SIGTERM, not killed")
	g.Expect(p.LogTail(100)).To(HaveSuffix("terminated\n"))
	g.Expect(p.Stop(time.Minute)).To(Succeed(), "stopping an ended process is a no-op")
	g.Expect(p.Kill()).To(Succeed())
}

func TestStopKillsWhatIgnoresSIGTERM(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "deaf")
	g.Eventually(func() string { return p.LogTail(100) }).Should(ContainSubstring("ready"))
	g.Expect(p.Stop(100 * time.Millisecond)).To(Succeed())
	_, err := p.Exited()
	g.Expect(err).To(MatchError("signal: killed"))
}

// A child's own children are in its process group: stopping it leaves nothing behind.
func TestKillEndsTheWholeProcessGroup(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "parent")
	var grandchild int
	g.Eventually(func() (err error) {
		_, err = fmt.Sscanf(p.LogTail(100), "grandchild %d", &grandchild)
		return err
	}).Should(Succeed())
	// Not through its parent (no Pdeathsig there, which would hide a Kill that misses the group).
	t.Cleanup(func() { _ = syscall.Kill(grandchild, syscall.SIGKILL) })
	g.Expect(running(grandchild)).To(BeTrue())
	g.Expect(p.Kill()).To(Succeed())
	// Reparented to init (or this machine's subreaper), which reaps it in its own time.
	g.Eventually(func() bool { return running(grandchild) }).WithTimeout(10*time.Second).Should(BeFalse(),
		"grandchild %d still runs after its parent's group was killed", grandchild)
}

// running is whether pid is a process that has not ended (neither gone nor a zombie).
func running(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func TestSignalPausesAndResumes(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "term")
	g.Eventually(func() string { return p.LogTail(100) }).Should(ContainSubstring("ready"))
	g.Expect(p.Signal(syscall.SIGSTOP)).To(Succeed())
	g.Eventually(func() string { return state(p.Pid()) }).Should(Equal("T"))
	g.Expect(p.Signal(syscall.SIGCONT)).To(Succeed())
	g.Eventually(func() string { return state(p.Pid()) }).ShouldNot(Equal("T"))
	g.Expect(p.Stop(time.Minute)).To(Succeed())
	g.Expect(p.Signal(syscall.SIGCONT)).To(MatchError(ContainSubstring("has exited")))
}

// state is the process's state letter in /proc/<pid>/stat.
func state(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}

func TestLogTailStartsAtAWholeLine(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "fail")
	g.Eventually(func() bool { done, _ := p.Exited(); return done }).Should(BeTrue())
	tail := p.LogTail(30)
	g.Expect(tail).To(Equal("line 499\nbad configuration\n"))
	g.Expect(p.LogTail(1 << 20)).To(HavePrefix("line 0\n"))
}

func TestWaitHTTPWaitsForOK(t *testing.T) {
	g := NewWithT(t)
	addr := freeAddr(t)
	p := start(t, "serve", "ADDR="+addr)
	g.Expect(p.WaitHTTP(context.Background(), "http://"+addr+"/readyz", time.Minute, 10*time.Millisecond)).To(Succeed())
	resp, err := http.Get("http://" + addr + "/")
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "it returned only once the process answered 200")
}

func TestWaitHTTPFailsWhenTheProcessExits(t *testing.T) {
	g := NewWithT(t)
	p := start(t, "fail")
	err := p.WaitHTTP(context.Background(), "http://"+freeAddr(t)+"/readyz", time.Minute, 10*time.Millisecond)
	g.Expect(err).To(MatchError(ContainSubstring("fail exited (exit status 3)")))
	g.Expect(err).To(MatchError(ContainSubstring("bad configuration")), "the end of the log")
	var exit *exec.ExitError
	g.Expect(errors.As(err, &exit)).To(BeTrue(), "the exit error is wrapped")
	g.Expect(exit.ExitCode()).To(Equal(3))
}

func TestWaitHTTPTimesOutWithTheLastAnswer(t *testing.T) {
	g := NewWithT(t)
	addr := freeAddr(t)
	p := start(t, "unready", "ADDR="+addr)
	g.Eventually(func() error {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}).Should(Succeed())
	err := p.WaitHTTP(context.Background(), "http://"+addr+"/readyz", 200*time.Millisecond, 10*time.Millisecond)
	g.Expect(err).To(MatchError(ContainSubstring("last answer: 503 Service Unavailable")))
	g.Expect(err).To(MatchError(ContainSubstring("not ready within 200ms")))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = p.WaitHTTP(ctx, "http://"+addr+"/readyz", time.Hour, 10*time.Millisecond)
	g.Expect(err).To(MatchError(context.Canceled), "the caller's cancellation, not a timeout")
}
