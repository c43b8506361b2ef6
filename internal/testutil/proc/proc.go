// Package proc is the one way the test helpers and the harnesses under hack/ run a program as a
// child process: its output in a log file, its own process group, killed by the kernel if the
// program that started it dies, waited for over HTTP, stopped with SIGTERM and then SIGKILL.
//
// The e2e stack (internal/testutil/stack), the redis-server helper (internal/testutil/redistest),
// Prometheus (internal/testutil/promtest), the sidecar launcher (internal/testutil/sidecarproc,
// for test/sidecar and the harnesses) and the drivers of hack/bench and hack/ratelimitcompare
// all start their processes here. Those two are modules of their own, but their import paths lie under this module's, so Go's
// internal-package rule lets them import it.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is a child process. It runs in its own process group, so a terminal's Ctrl-C reaches
// only the program that started it, which then stops its children in order; and it is killed
// by the kernel (SIGKILL) if that program dies without cleaning up.
type Process struct {
	// Name identifies the process in errors and names its log file.
	Name string
	// LogPath receives the process's stdout and stderr.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // the result of Wait, once done is closed
}

// Start starts bin with args, logging to dir/<name>.log (created with dir if missing, appended
// to if it exists: a process started again under the same name keeps the earlier runs' lines
// above its own). The process sees exactly env, or this program's environment when env is nil.
func Start(dir, name, bin string, args, env []string) (*Process, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the log directory of %s: %w", name, err)
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process group, for faults such as SIGSTOP and SIGCONT.
func (p *Process) Signal(sig syscall.Signal) error {
	if done, _ := p.Exited(); done {
		return fmt.Errorf("%s (pid %d) has exited", p.Name, p.Pid())
	}
	if err := syscall.Kill(-p.Pid(), sig); err != nil {
		return fmt.Errorf("sending %s to %s (pid %d): %w", sig, p.Name, p.Pid(), err)
	}
	return nil
}

// Stop asks the process group to end (SIGTERM) and kills it after grace.
func (p *Process) Stop(grace time.Duration) error {
	if done, _ := p.Exited(); done {
		return nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	return p.Kill()
}

// Kill ends the process group at once (SIGKILL), like a crash or an OOM kill, and waits for it.
func (p *Process) Kill() error {
	if done, _ := p.Exited(); done {
		return nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
}

// LogTail returns the last n bytes of the process's log, from the first whole line, for error
// messages.
func (p *Process) LogTail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	if len(data) > n {
		data = data[len(data)-n:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}

// Log returns the process's whole log so far.
func (p *Process) Log() string {
	data, _ := os.ReadFile(p.LogPath)
	return string(data)
}

// ExitError is the error of a wait for something from a process that has died: how it ended
// and the end of its log.
func (p *Process) ExitError() error {
	_, err := p.Exited()
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("%s exited (%w); last lines of %s:\n%s", p.Name, err, p.LogPath, p.LogTail(3000))
}

// WaitHTTP polls url every interval until it answers 200 OK. It fails with ExitError as soon as
// the process has ended, and when timeout passes or ctx ends with the last answer it saw and the
// end of the log.
func (p *Process) WaitHTTP(ctx context.Context, url string, timeout, interval time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("not ready within %s", timeout))
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	last := "no answer"
	for {
		if done, _ := p.Exited(); done {
			return p.ExitError()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("building the request to %s: %w", url, err)
		}
		if resp, err := hc.Do(req); err != nil {
			if ctx.Err() == nil { // else the error says only that ctx ended
				last = err.Error()
			}
		} else {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		}
		select {
		case <-p.done: // the next round says how it ended
		case <-ctx.Done():
			return fmt.Errorf("%s at %s (last answer: %s): %w; last lines of %s:\n%s",
				p.Name, url, last, context.Cause(ctx), p.LogPath, p.LogTail(3000))
		case <-time.After(interval):
		}
	}
}
