// Package cluster runs Redline as a user installs it, on a real one-node cluster of this machine
// (hack/cluster/up.sh: a kubelet, containerd, kube-proxy, a bridge): the images `make images`
// built, imported into containerd; the chart installed with Helm as a library at its defaults
// but for where Redis is and the sidecars' Redis timeout (installValues says why); a Redis on
// the host, bound to the cluster's bridge; workloads as pods behind Services that kube-proxy
// routes; metrics-server, for the HPAs, and cert-manager, for the chart's certManager mode, built
// from their Go modules with their own charts (hack/cluster/addons.sh).
//
// It is a module of its own (Helm's dependency graph), run by `make test-cluster` as root. A
// missing prerequisite (root, the node's binaries, containerd, the images, redis-server) fails
// the suite with what provides it; nothing is skipped.
package cluster

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The cluster's addresses (hack/cluster/env.sh).
const (
	nodeIP    = "10.213.0.1"
	redisPort = "6390"
	echoImage = "redline.local/echo:test"
)

// suite is what TestMain started, for the tests.
var suite struct {
	root       string
	lock       *os.File
	scratch    string
	kubeconfig string
	cfg        *rest.Config
	client     client.Client
	redis      *hostRedis
	started    time.Time
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	suite.started = time.Now()
	err := setUp()
	code := 1
	if err == nil {
		code = m.Run()
	} else {
		fmt.Fprintf(os.Stderr, "cluster suite: %v\n", err)
	}
	if suite.lock == nil {
		// Another suite holds the machine's cluster: nothing here is this run's to keep or tear
		// down (down.sh would stop the other suite's cluster under its tests).
		return code
	}
	if code != 0 {
		keepLogs()
	}
	if err := tearDown(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster suite: teardown: %v\n", err)
		code = 1
	}
	logf("suite done after %s", since(suite.started))
	return code
}

func setUp() error {
	_, file, _, _ := runtime.Caller(0)
	suite.root = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	if os.Geteuid() != 0 {
		return errors.New("must run as root: it starts a kubelet, containerd, a bridge and iptables rules (make test-cluster)")
	}
	if err := lockMachine(); err != nil {
		return err
	}
	var err error
	if suite.scratch, err = os.MkdirTemp("", "redline-cluster-suite-"); err != nil {
		return fmt.Errorf("the suite's scratch directory: %w", err)
	}
	archives, err := imageArchives()
	if err != nil {
		return err
	}
	t0 := time.Now()
	kubeconfig, err := runScript("up.sh", archives...)
	if err != nil {
		return err
	}
	logf("cluster up (node Ready) after %s", since(t0))
	suite.kubeconfig = kubeconfig
	if suite.cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return fmt.Errorf("reading the cluster's kubeconfig %s: %w", kubeconfig, err)
	}
	if suite.client, err = client.New(suite.cfg, client.Options{}); err != nil {
		return fmt.Errorf("client of the cluster: %w", err)
	}
	if suite.redis, err = startHostRedis(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := installChart(ctx); err != nil {
		return err
	}
	return installMetricsServer(ctx)
}

func tearDown() error {
	if suite.lock == nil {
		return nil // another suite's cluster: not ours to tear down
	}
	var errs []error
	if suite.redis != nil {
		errs = append(errs, suite.redis.stop())
	}
	t0 := time.Now()
	if _, err := runScript("down.sh"); err != nil {
		errs = append(errs, err)
	}
	logf("cluster down after %s", since(t0))
	if suite.scratch != "" {
		errs = append(errs, os.RemoveAll(suite.scratch))
	}
	if suite.lock != nil {
		errs = append(errs, suite.lock.Close())
	}
	return errors.Join(errs...)
}

// lockWait bounds how long a suite waits for another suite's cluster to go: within the
// Makefile's 30-minute test timeout, with room for this suite's own run.
const lockWait = 20 * time.Minute

// lockMachine takes the machine's one cluster. A second suite started beside this one waits
// for the first to finish (up to lockWait) instead of tearing its cluster down, and touches
// nothing of it if the wait runs out.
func lockMachine() error {
	path := filepath.Join(os.TempDir(), "redline-cluster.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	deadline := time.Now().Add(lockWait)
	for waited := false; ; waited = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			suite.lock = f
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			_ = f.Close()
			return fmt.Errorf("another cluster suite holds %s (one cluster per machine): %w", path, err)
		}
		if !waited {
			logf("another cluster suite holds %s: waiting up to %s for it to finish", path, lockWait)
		}
		time.Sleep(5 * time.Second)
	}
}

// keepLogs copies the cluster's logs (its components' and its pods') out of the directory
// down.sh removes, for a failed run to be read.
func keepLogs() {
	dir := os.Getenv("CLUSTER_DIR")
	if dir == "" {
		dir = "/tmp/redline-cluster"
	}
	keep, err := os.MkdirTemp("", "redline-cluster-logs-")
	if err != nil {
		logf("keeping the logs: %v", err)
		return
	}
	for _, sub := range []string{"logs", "pod-logs"} {
		if out, err := exec.Command("cp", "-a", filepath.Join(dir, sub), keep).CombinedOutput(); err != nil {
			logf("keeping %s: %v %s", sub, err, out)
		}
	}
	logf("the cluster's logs are kept in %s", keep)
}

// imageArchives are the images `make images` wrote (IMAGES_DIR, bin/images by default), the
// suite's application image, built here, and the add-ons' (hack/cluster/addons.sh).
func imageArchives() ([]string, error) {
	dir := os.Getenv("IMAGES_DIR")
	if dir == "" {
		dir = filepath.Join(suite.root, "bin", "images")
	}
	var out []string
	for _, name := range []string{"manager.tar", "sidecar.tar"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image archive %s missing: run `make images` (make test-cluster does): %w", p, err)
		}
		out = append(out, p)
	}
	echo, err := buildEchoImage()
	if err != nil {
		return nil, err
	}
	addons, err := addonArchives()
	if err != nil {
		return nil, err
	}
	return append(append(out, echo), addons...), nil
}

// buildEchoImage packs ./echo with hack/images, as make images packs the manager.
func buildEchoImage() (string, error) {
	dir := suite.scratch
	bin := filepath.Join(dir, "echo")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./echo")
	build.Dir = filepath.Join(suite.root, "test", "cluster")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the echo application: %w\n%s", err, out)
	}
	pack := exec.Command("go", "run", ".", "-out", dir, echoImage+"="+bin)
	pack.Dir = filepath.Join(suite.root, "hack", "images")
	if out, err := pack.CombinedOutput(); err != nil {
		return "", fmt.Errorf("packing the echo image: %w\n%s", err, out)
	}
	return filepath.Join(dir, "echo.tar"), nil
}

// runScript runs hack/cluster/<name>, its log on stderr, and returns the last line it printed.
func runScript(name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(suite.root, "hack", "cluster", name), args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/cluster/%s: %w", name, err)
	}
	var last string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	return last, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[cluster-suite] "+format+"\n", args...)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }
