package sidecarproc

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Files are what kubelet gives an injected sidecar: the policies volume and the labels file of
// the downward API.
type Files struct {
	// ConfigDir is the sidecar's --config-dir.
	ConfigDir string
	// Labels is the sidecar's --pod-labels.
	Labels string
}

// WriteFiles writes the compiled policies document doc under dir/policies and a pod whose only
// label is app=<app> under dir/podinfo, the way kubelet writes those volumes.
func WriteFiles(dir string, doc []byte, app string) (Files, error) {
	f := Files{ConfigDir: filepath.Join(dir, "policies")}
	info := filepath.Join(dir, "podinfo")
	if err := kubeletdir.Write(f.ConfigDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		return Files{}, fmt.Errorf("writing the policies: %w", err)
	}
	if err := kubeletdir.Write(info, map[string][]byte{"labels": fmt.Appendf(nil, "app=%q\n", app)}); err != nil {
		return Files{}, fmt.Errorf("writing the labels: %w", err)
	}
	f.Labels = filepath.Join(info, "labels")
	return f, nil
}

// Options say how to run one sidecar.
type Options struct {
	// Bin is the sidecar binary (Build).
	Bin string
	// Dir receives the log, <Name>.log.
	Dir string
	// Name names the process and its log; it is the pod's name (POD_NAME) unless Pod is set.
	Name, Pod string
	// Namespace is the pod's namespace (POD_NAMESPACE): the namespace of the policies.
	Namespace string
	Files     Files
	// RedisURL is REDLINE_REDIS_URL.
	RedisURL string
	// Upstream is the application the proxy face forwards to; empty, a free loopback port
	// nothing listens on (for harnesses that load only the decision faces).
	Upstream string
	// Args come after the flags Start sets, so that they win.
	Args []string
	// Env comes after the environment Start sets (NAME=value), so that it wins.
	Env []string
	// AnyPort binds every face on port 0 and reads the addresses the kernel gave from the
	// sidecar's "listening" log line, so that no other process can take a port between its
	// choice and its bind. It logs at info level at least, for that line; sidecars built before
	// that line existed need it false (ports are then chosen free beforehand).
	AnyPort bool
	// ReadyPath is the admin path Start waits for a 200 from: /readyz unless set (/healthz for a
	// sidecar that is not meant to be ready yet).
	ReadyPath string
}

// Sidecar is a sidecar process with every face on a loopback port of its own.
type Sidecar struct {
	*proc.Process
	// Proxy, Admin (/readyz, /metrics), Check (/v1/check) and GRPC (Envoy RLS) are host:port.
	Proxy, Admin, Check, GRPC string
}

// readyTimeout is how long Start waits for the listening line and for the ready path.
const readyTimeout = 30 * time.Second

// Start runs the sidecar with warn-level logs (info with AnyPort) and the flags every sidecar
// version the harnesses build knows, and waits until the ready path answers 200. The caller
// stops it (Stop).
func Start(ctx context.Context, o Options) (*Sidecar, error) {
	var addrs [5]string
	for i := range addrs {
		if o.AnyPort && i < 4 {
			addrs[i] = "127.0.0.1:0"
			continue
		}
		p, err := redistest.FreePort()
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	s := &Sidecar{Proxy: addrs[0], Admin: addrs[1], Check: addrs[2], GRPC: addrs[3]}
	upstream := o.Upstream
	if upstream == "" {
		upstream = addrs[4]
	}
	pod := o.Pod
	if pod == "" {
		pod = o.Name
	}
	level := "warn"
	if o.AnyPort {
		level = "info"
	}
	args := append([]string{"--listen=" + s.Proxy, "--upstream=" + upstream, "--admin-listen=" + s.Admin,
		"--check-listen=" + s.Check, "--grpc-listen=" + s.GRPC, "--config-dir=" + o.Files.ConfigDir,
		"--pod-labels=" + o.Files.Labels, "--log-level=" + level}, o.Args...)
	env := append(os.Environ(), "REDLINE_REDIS_URL="+o.RedisURL, "POD_NAME="+pod, "POD_NAMESPACE="+o.Namespace)
	p, err := proc.Start(o.Dir, o.Name, o.Bin, args, append(env, o.Env...))
	if err != nil {
		return nil, err
	}
	s.Process = p
	if o.AnyPort {
		if err := s.readAddrs(ctx); err != nil {
			_ = p.Stop(3 * time.Second)
			return nil, err
		}
	}
	path := o.ReadyPath
	if path == "" {
		path = "/readyz"
	}
	if err := p.WaitHTTP(ctx, "http://"+s.Admin+path, readyTimeout, 20*time.Millisecond); err != nil {
		_ = p.Stop(3 * time.Second)
		return nil, fmt.Errorf("waiting for the sidecar to answer %s: %w", path, err)
	}
	return s, nil
}

// readAddrs waits for the sidecar's "listening" line and takes the addresses it bound, on
// loopback where it bound every interface.
func (s *Sidecar) readAddrs(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, readyTimeout, fmt.Errorf("no \"listening\" line within %s", readyTimeout))
	defer cancel()
	for {
		for line := range strings.SplitSeq(s.Log(), "\n") {
			var l struct{ Msg, Proxy, Admin, Check, GRPC string }
			if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "listening" {
				continue
			}
			s.Proxy, s.Admin, s.Check, s.GRPC = loopback(l.Proxy), loopback(l.Admin), loopback(l.Check), loopback(l.GRPC)
			return nil
		}
		select {
		case <-s.Done():
			return s.ExitError()
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last lines of %s:\n%s", s.Name, context.Cause(ctx), s.LogPath, s.LogTail(3000))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// loopback is addr with an unspecified host (every interface) replaced by 127.0.0.1.
func loopback(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
