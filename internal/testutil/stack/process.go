package stack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is a child process started by the stack. It runs in its own process group, so a
// terminal's Ctrl-C reaches only the program that owns the stack, which then stops its children
// in order; and it is killed by the kernel if that program dies without cleaning up.
type Process struct {
	// Name identifies the process in errors and log file names.
	Name string
	// LogPath receives the process's stdout and stderr.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // the result of Wait, once done is closed
}

// StartProcess starts bin with args, logging to dir/<name>.log. The process sees exactly env,
// or this program's environment when env is nil.
func StartProcess(dir, name, bin string, args, env []string) (*Process, error) {
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

// LogTail returns the last n bytes of the process's log, for error messages.
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

// errExited is returned while waiting for something from a process that has died.
func (p *Process) errExited() error {
	_, err := p.Exited()
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("%s exited (%w); last lines of %s:\n%s", p.Name, err, p.LogPath, p.LogTail(3000))
}
