package failover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// Auth is how a cell's sidecars reach Redis.
type Auth int

const (
	// TenantACL is what the chart installs: Redis's default user (and the sentinels') has a
	// password only the manager holds, and the manager binary, run with none of its intervals
	// or modes set (so --redis-tenant-acl=auto and --script-check-interval at their defaults)
	// against a control plane (envtest), gives the namespace its own ACL user on every node,
	// loads every script a sidecar runs on every node, replicas too, and watches for restarts.
	// The sidecars read the credentials it writes into the namespace's Secret, as the injected
	// ones read them from its volume: they may not SCRIPT LOAD, so after a failover or a
	// restart only the manager can give Redis the scripts (and, after a restart, the user).
	TenantACL Auth = iota
	// DefaultUser is the control: no manager and no password; the sidecars run on Redis's
	// default user and load the scripts themselves when Redis answers NOSCRIPT.
	DefaultUser
)

func (a Auth) String() string {
	if a == DefaultUser {
		return "default user"
	}
	return "tenant ACL"
}

// The admin passwords of a TenantACL cell: Redis's default user's (every data node) and the
// sentinels'. Only the manager and the cell's own clients hold them.
const (
	adminPassword    = "failover-admin"
	sentinelPassword = "failover-sentinel"
)

// ManagerNamespace is where the manager believes it runs (POD_NAMESPACE): the key its
// passwords are derived from lives there.
const ManagerNamespace = "redline-system"

// The flags whose defaults the TenantACL cells run on: the Env never passes them unless
// Options.ManagerArgs does.
const (
	FlagScriptCheckInterval = "script-check-interval"
	FlagTenantACL           = "redis-tenant-acl"
)

// redisSetup is what a cell's manager and sidecars need of its Redis.
type redisSetup struct {
	url string
	// nodes are every data node's address (the manager sets the user and the scripts on
	// each); sentinels every sentinel's, with Sentinel.
	nodes, sentinels []string
}

// access is one cell's way into Redis: the credentials directory its sidecars read (empty for
// DefaultUser) and the manager that writes it.
type access struct {
	credsDir string
	manager  *proc.Process
}

func (a *access) stop() {
	if a != nil && a.manager != nil {
		_ = a.manager.Stop(10 * time.Second)
	}
}

// logTail is the end of the manager's log, for a failure's message.
func (a *access) logTail(n int) string {
	if a == nil || a.manager == nil {
		return ""
	}
	return fmt.Sprintf("--- %s (%s)\n%s\n", a.manager.Name, a.manager.LogPath, a.manager.LogTail(n))
}

// provision gives a cell's sidecars their way into Redis. DefaultUser: nothing to do. TenantACL:
// it starts the manager on r with the admin passwords and none of the flags under test, waits
// until the manager has set the namespace's user on every node (and the sentinel reader on
// every sentinel) and loaded every sidecar script on every node, and writes the namespace's
// Secret into a credentials directory the way kubelet writes a Secret volume.
func (e *Env) provision(ctx context.Context, auth Auth, r redisSetup) (_ *access, err error) {
	if auth == DefaultUser {
		return &access{}, nil
	}
	cp, err := e.startControlPlane(ctx)
	if err != nil {
		return nil, err
	}
	bin, err := e.ManagerBinary(ctx)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("cell%d-manager", e.cellSeq)
	pwFile := filepath.Join(e.o.Dir, name+"-redis-password")
	if err := os.WriteFile(pwFile, []byte(adminPassword+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing the admin password file: %w", err)
	}
	probePort, err := redistest.FreePort()
	if err != nil {
		return nil, fmt.Errorf("choosing the manager's probe port: %w", err)
	}
	wio := &cp.env.WebhookInstallOptions
	// What the chart passes that the manager needs here, nothing else: the intervals and the
	// tenant ACL mode stay the binary's defaults.
	args := []string{
		"--kubeconfig=" + cp.kubeconfig,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(probePort),
		"--redis-url=" + r.url,
		"--redis-password-file=" + pwFile,
		"--webhook-port=" + strconv.Itoa(wio.LocalServingPort),
		"--webhook-cert-dir=" + wio.LocalServingCertDir,
		"--sidecar-image=redline-sidecar:failover",
	}
	if len(r.sentinels) > 0 {
		sf := filepath.Join(e.o.Dir, name+"-sentinel-password")
		if err := os.WriteFile(sf, []byte(sentinelPassword+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("writing the sentinel password file: %w", err)
		}
		args = append(args, "--redis-sentinel-password-file="+sf)
	}
	args = append(args, e.o.ManagerArgs...)
	env := append(os.Environ(), "KUBECONFIG="+cp.kubeconfig, "POD_NAMESPACE="+ManagerNamespace)
	p, err := proc.Start(e.o.Dir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	a := &access{manager: p, credsDir: filepath.Join(e.o.Dir, name+"-credentials")}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, a.logTail(3000))
			a.stop()
		}
	}()
	if err := p.WaitHTTP(ctx, "http://127.0.0.1:"+strconv.Itoa(probePort)+"/readyz", time.Minute, 100*time.Millisecond); err != nil {
		return nil, err
	}
	e.o.Progress("manager ready; waiting for the namespace's Redis user and the scripts on every node")
	data, err := e.waitProvisioned(ctx, cp, r)
	if err != nil {
		return nil, err
	}
	if err := kubeletdir.Write(a.credsDir, data); err != nil {
		return nil, fmt.Errorf("writing the credentials volume: %w", err)
	}
	return a, nil
}

// waitProvisioned waits, for at most a minute, until the namespace's Secret holds its
// credentials, they authenticate on every data node (and the sentinel reader's on every
// sentinel), and every node holds every script a sidecar runs; it returns the Secret's data.
func (e *Env) waitProvisioned(ctx context.Context, cp *controlPlane, r redisSetup) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var shas []string
	for _, s := range redisacl.SidecarScripts() {
		shas = append(shas, s.SHA)
	}
	var last error
	for {
		var sec corev1.Secret
		err := cp.client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: podinject.DefaultConfig().RedisSecret}, &sec)
		if err == nil {
			err = provisioned(ctx, sec.Data, r, shas)
		}
		if err == nil {
			return sec.Data, nil
		}
		last = err
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("waiting for the manager to provision namespace %s: %w (last: %v)", Namespace, err, last)
		}
	}
}

// provisioned says what is still missing of the namespace's credentials in data on r.
func provisioned(ctx context.Context, data map[string][]byte, r redisSetup, shas []string) error {
	user, pw := string(data[contract.RedisUsernameKey]), string(data[contract.RedisSecretKey])
	if user != redisacl.Username(Namespace) || pw == "" {
		return fmt.Errorf("the namespace's Secret holds user %q", user)
	}
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	check := func(addr string, fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", addr, err))
				mu.Unlock()
			}
		})
	}
	for _, addr := range r.nodes {
		check(addr, func(ctx context.Context) error {
			tc := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pw, MaxRetries: -1})
			defer tc.Close()
			if err := tc.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("as %s: %w", user, err)
			}
			ac := redis.NewClient(&redis.Options{Addr: addr, Password: adminPassword, MaxRetries: -1})
			defer ac.Close()
			exists, err := ac.ScriptExists(ctx, shas...).Result()
			if err != nil {
				return fmt.Errorf("SCRIPT EXISTS: %w", err)
			}
			if n := countFalse(exists); n > 0 {
				return fmt.Errorf("%d of %d sidecar scripts missing", n, len(shas))
			}
			return nil
		})
	}
	if len(r.sentinels) > 0 {
		su, spw := string(data[contract.RedisSentinelUsernameKey]), string(data[contract.RedisSentinelSecretKey])
		if su != redisacl.SentinelReaderUser || spw == "" {
			return fmt.Errorf("the namespace's Secret holds sentinel user %q", su)
		}
		for _, addr := range r.sentinels {
			check(addr, func(ctx context.Context) error {
				sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Username: su, Password: spw, MaxRetries: -1})
				defer func() { _ = sc.Close() }()
				if err := sc.Ping(ctx).Err(); err != nil {
					return fmt.Errorf("as %s: %w", su, err)
				}
				return nil
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func countFalse(bs []bool) int {
	n := 0
	for _, b := range bs {
		if !b {
			n++
		}
	}
	return n
}
