// Package stack runs Redline's whole story on one machine, with real parts: etcd and
// kube-apiserver (envtest), kube-controller-manager (so Deployments become Pods), a
// redis-server on a loopback port, the manager binary (controller and injection webhook) and
// sidecar binaries configured exactly as the injected Pod spec says. There is no kubelet: the
// stack plays its part for the sidecars (arguments, environment, volume files).
//
// `make demo` and the end-to-end suite share it. Every process it starts runs in its own
// process group and is stopped by Stack.Stop, which is safe to call on any path (success,
// failure, interrupt) and more than once.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Options configure a Stack. The zero value is usable.
type Options struct {
	// InstallTools lets the stack run hack/setup-envtest.sh when KUBEBUILDER_ASSETS is unset
	// (the demo); without it a missing variable is an error (the tests).
	InstallTools bool
	// ScriptCheckInterval, when set, is the manager's --script-check-interval; zero leaves the
	// manager's default (backend.DefaultCheckInterval), which is what the chart ships and so
	// what the suites run. Set it only in a test that measures another interval as a control.
	ScriptCheckInterval time.Duration
	// ManagerArgs are extra manager flags.
	ManagerArgs []string
	// Progress receives one line per step ("starting kube-apiserver ..."); nil discards them.
	Progress io.Writer
	// KeepDir keeps the working directory (logs, kubeconfig, volume files) after Stop.
	KeepDir bool
	// RedisPassword, when set, is the password of Redis's default user (requirepass), which
	// the manager gets as its admin credential; sidecars then get in only as their
	// namespace's own user, as in a multi-tenant installation.
	RedisPassword string
}

// Stack is a running local Redline installation.
type Stack struct {
	// Dir holds the kubeconfig, binaries, logs and the sidecars' volume files.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig for the API server.
	Kubeconfig string
	// Config and Client talk to the API server as an administrator (no cache).
	Config *rest.Config
	Client client.Client
	// Redis is the redis-server the manager and sidecars use; Stop/Start it for outages.
	Redis *redistest.Server
	// Bin are the manager and sidecar binaries.
	Bin Binaries
	// Manager is the manager process (replaced by RestartManager).
	Manager *proc.Process

	opts     Options
	root     string
	env      *envtest.Environment
	kcm      *proc.Process
	mgrArgs  []string
	probeURL string

	mu       sync.Mutex
	cleanups []func() error
	stopped  bool
}

// Scheme knows the built-in types and RateLimitPolicy.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// Start brings up the control plane, Redis and the manager. On error everything already
// started is stopped again. The caller must call Stop.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redline-stack-")
	if err != nil {
		return nil, fmt.Errorf("creating the stack directory: %w", err)
	}
	s := &Stack{Dir: dir, opts: opts, root: root}
	s.addCleanup(func() error {
		if opts.KeepDir {
			return nil
		}
		return os.RemoveAll(dir)
	})
	defer func() {
		if err != nil {
			if stopErr := s.Stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()

	// Check the parts that cannot be built here first, so a missing one fails at once.
	assets, err := ControlPlaneAssets(root, opts.InstallTools)
	if err != nil {
		return nil, err
	}
	if _, err := redistest.Binary(); err != nil {
		return nil, err
	}

	// The compiler is the slow part; the control plane starts meanwhile.
	s.progress("building bin/manager and bin/sidecar (go build)")
	type built struct {
		b   Binaries
		err error
	}
	buildDone := make(chan built, 1)
	go func() {
		b, err := BuildBinaries(ctx, root, dir)
		buildDone <- built{b, err}
	}()
	defer func() {
		if err != nil { // do not return while the compiler still writes into dir
			<-buildDone
		}
	}()

	if err := s.startControlPlane(ctx, assets); err != nil {
		return nil, err
	}
	s.progress("starting redis-server")
	var redisArgs []string
	if opts.RedisPassword != "" {
		redisArgs = append(redisArgs, "--requirepass", opts.RedisPassword)
	}
	s.Redis, err = redistest.Start(redisArgs...)
	if err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	s.addCleanup(s.Redis.Close)
	s.progress("redis-server listening on %s", s.Redis.Addr())

	res := <-buildDone
	buildDone <- res // the deferred wait above must not block
	if res.err != nil {
		return nil, fmt.Errorf("building the Redline binaries: %w", res.err)
	}
	s.Bin = res.b
	if err := s.startManager(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Stop stops every process the stack started, newest first, and removes its directory.
func (s *Stack) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	cleanups := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	var errs []error
	for _, f := range slices.Backward(cleanups) {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addCleanup registers f to run on Stop; f runs at once when the stack is already stopped.
func (s *Stack) addCleanup(f func() error) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = f()
		return
	}
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

func (s *Stack) progress(format string, args ...any) {
	_, _ = fmt.Fprintf(s.opts.Progress, "  · "+format+"\n", args...)
}

// path joins elements under the stack directory.
func (s *Stack) path(elem ...string) string {
	return filepath.Join(append([]string{s.Dir}, elem...)...)
}
