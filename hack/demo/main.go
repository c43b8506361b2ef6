// Command demo tells Redline's story on this machine in about a minute, with real parts:
// etcd, kube-apiserver and kube-controller-manager, a redis-server, the manager (controller
// and injection webhook) and three sidecars configured from the Pods the webhook injected.
// It compares Redline with three in-memory limiters, changes the policy through the API,
// stops Redis to show the failure mode, and cleans up everything it started, also on Ctrl-C.
// A real Prometheus (when installed) scrapes the manager and the sidecars throughout; at the
// end the demo prints what it returned per phase, writes results/demo.json and demo.md, and
// draws results/demo.png with hack/bench's demoplot command.
//
// Run it with `make demo` (go run ./hack/demo). Flags: -keep leaves the working directory
// (logs, kubeconfig, the sidecars' volume files) in place; -pause keeps everything running
// after the last step, until Ctrl-C, for a look around with kubectl and Prometheus's graph
// page; -results is where demo.json, demo.md and demo.png go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/promtest"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// The demo's workload: the checkout sample policy on a Deployment of three replicas.
const (
	namespace    = "shop"
	appName      = "checkout"
	replicas     = 3
	upstreamPort = 8080
	samplePolicy = "config/samples/checkout_per_api_key.yaml"
	keyHeader    = "X-API-Key"
	path         = "/api/orders"
	updatedLimit = 50
	outage       = 4 * time.Second
	steps        = 7
)

func main() {
	keep := flag.Bool("keep", false, "keep the working directory (logs, kubeconfig, volume files) after the demo")
	pause := flag.Bool("pause", false, "after the last step, keep everything running until Ctrl-C")
	results := flag.String("results", "", "directory for demo.json, demo.md and demo.png (default: results/ of the repository)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	d := &demo{out: os.Stdout, keep: *keep, pause: *pause, results: *results, began: time.Now()}
	err := d.run(ctx)
	stop()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "\ninterrupted: every process the demo started has been stopped")
		os.Exit(130)
	default:
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

// demo holds what the steps share.
type demo struct {
	out         io.Writer
	keep, pause bool
	results     string
	began       time.Time
	// obs is the Prometheus beside the stack; nil when prometheus is not installed.
	obs        *observer
	noProm     error
	managerMet string

	st       *stack.Stack
	policy   *v1alpha1.RateLimitPolicy
	pods     []corev1.Pod
	upstream *stack.Upstream
	sidecars []*stack.Sidecar
	proxies  []string
	rows     []row
	keySeq   int
	// candidate says what the candidate limit would have refused (results/demo.md).
	candidate string
}

func (d *demo) run(ctx context.Context) (err error) {
	d.say("Redline demo: one rate limit shared by every replica of a service.")
	d.say("Everything below runs on this machine: etcd, kube-apiserver, kube-controller-manager,")
	d.say("redis-server, the Redline manager and three Redline sidecars. Nothing is mocked.")
	if _, err := promtest.Binary(); err != nil {
		// The story stands without it; only the observability part is left out.
		d.noProm = err
		d.say("\nNote: %v.", err)
		d.say("The demo runs without Prometheus: no browser link, no results/demo.png, demo.md or demo.json.")
	} else {
		d.say("A real Prometheus scrapes the manager and the sidecars every second throughout.")
	}
	if d.results == "" {
		root, err := stack.RepoRoot()
		if err != nil {
			return err
		}
		d.results = filepath.Join(root, "results")
	}
	metricsPort, err := redistest.FreePort()
	if err != nil {
		return fmt.Errorf("choosing the manager's metrics port: %w", err)
	}
	d.managerMet = "127.0.0.1:" + strconv.Itoa(metricsPort)

	d.step(1, "Start a local cluster, Redis and the Redline manager")
	st, err := stack.Start(ctx, stack.Options{InstallTools: true, Progress: d.out, KeepDir: d.keep,
		ManagerArgs: []string{"--metrics-bind-address=" + d.managerMet}})
	if err != nil {
		return err
	}
	d.st = st
	defer func() {
		d.step(steps, "Clean up")
		if stopErr := d.obs.stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stopping prometheus: %w", stopErr))
		}
		if stopErr := st.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", stopErr))
		}
		if d.obs != nil {
			d.say("  stopped prometheus")
		}
		d.say("  stopped the sidecars, the manager, kube-controller-manager, redis-server, kube-apiserver and etcd")
		if d.keep {
			d.say("  logs and files kept in %s", st.Dir)
		}
		if err == nil {
			d.summary()
		}
	}()
	d.say("  ready after %s", seconds(time.Since(d.began)))

	for _, f := range []func(context.Context) error{d.deploy, d.runSidecars, d.compare, d.changeAndBreak, d.observed} {
		if err := f(ctx); err != nil {
			return err
		}
	}
	if d.pause {
		d.say("\nEverything is still running. In another terminal:")
		d.say("  export KUBECONFIG=%s", st.Kubeconfig)
		d.say("  kubectl -n %s get rlp,deploy,pods,configmap", namespace)
		d.say("  curl -si -X POST -H '%s: me' %s%s", keyHeader, d.proxies[0], path)
		if d.obs != nil {
			d.say("Prometheus (admitted and refused per second per pod):")
			d.say("  %s", d.obs.graphURL())
		}
		d.say("Press Ctrl-C to clean up.")
		<-ctx.Done()
	}
	return nil
}

// deploy is step 2: the sample policy and the opted-in Deployment.
func (d *demo) deploy(ctx context.Context) error {
	d.step(2, "Apply a RateLimitPolicy and a Deployment of 3 replicas opted in to injection")
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, samplePolicy))
	if err != nil {
		return fmt.Errorf("reading the sample policy: %w", err)
	}
	d.policy = &v1alpha1.RateLimitPolicy{}
	if err := yaml.UnmarshalStrict(data, d.policy); err != nil {
		return fmt.Errorf("parsing %s: %w", samplePolicy, err)
	}
	d.policy.Namespace = namespace
	// A candidate at half the limit, counted beside it on the same requests and never
	// refusing: what lowering the limit would do, measured before it is done (step 5 promotes it).
	d.policy.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{
		Requests: updatedLimit, Window: d.policy.Spec.Rules[0].Limit.Window}}
	if err := d.st.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	if err := d.st.ApplyPolicy(ctx, d.policy); err != nil {
		return err
	}
	r := d.policy.Spec.Rules[0]
	d.say("  applied %s in namespace %s:", samplePolicy, namespace)
	d.say("    %d %s under %s per %s per value of header %s, algorithm %s, failureMode %s",
		r.Limit.Requests, strings.Join(methods(r), ","), pathOf(r), shortDuration(r.Limit.Window.Duration),
		keyHeader, r.Algorithm, d.policy.Spec.FailureMode)
	d.say("    and a candidate limit of %d per %s beside it: counted on the same requests, it refuses nothing",
		r.Candidate.Limit.Requests, shortDuration(r.Candidate.Limit.Window.Duration))
	p, err := d.st.WaitProgrammed(ctx, namespace, d.policy.Name, time.Minute)
	if err != nil {
		return err
	}
	doc, _, err := d.st.PoliciesDocument(ctx, namespace)
	if err != nil {
		return err
	}
	d.say("  the controller compiled it: Programmed=True, ConfigMap %s/redline-policies hash %.12s", namespace, doc.Hash)
	for _, s := range p.Status.Scripts {
		d.say("  and loaded its script into Redis: %s = SHA1 %.12s (the sidecars call EVALSHA)", s.Algorithm, s.SHA)
	}

	app := stack.App{Namespace: namespace, Name: appName, Replicas: replicas,
		Labels: map[string]string{"app": appName}, UpstreamPort: upstreamPort}
	if err := d.st.CreateDeployment(ctx, app); err != nil {
		return err
	}
	d.say("  created Deployment %s/%s: replicas 3, pod template annotated redline.dev/inject: \"true\", upstream-port %d",
		namespace, appName, upstreamPort)
	pods, err := d.st.WaitPods(ctx, app, time.Minute)
	if err != nil {
		return err
	}
	d.say("  kube-controller-manager created the Pods; the webhook injected the sidecar into each:")
	for i := range pods {
		sc, _ := stack.SidecarContainer(&pods[i])
		kind := "container"
		if sc.RestartPolicy != nil {
			kind = "native sidecar (init container, restartPolicy Always)"
		}
		d.say("    %s: %s %s, %d volumes, env %s", pods[i].Name, sc.Name, kind, len(pods[i].Spec.Volumes), envNames(sc.Env))
	}
	d.pods = pods
	return nil
}

// runSidecars is step 3.
func (d *demo) runSidecars(ctx context.Context) error {
	d.step(3, "Run the 3 sidecars exactly as the Pod specs say, in front of a tiny upstream")
	up, err := d.st.StartUpstream()
	if err != nil {
		return err
	}
	d.upstream = up
	d.say("  upstream app on %s; no kubelet here, so the demo plays its part: the args with ports", up.Addr)
	d.say("  moved to free loopback ports, the env, the ConfigMap and labels written as volume files")
	d.sidecars, err = d.st.RunSidecars(ctx, d.pods, up.Addr)
	if err != nil {
		return err
	}
	for _, sc := range d.sidecars {
		d.proxies = append(d.proxies, sc.ProxyURL)
		d.say("    %s: proxy %s -> %s", sc.Pod.Name, strings.TrimPrefix(sc.ProxyURL, "http://"), up.Addr)
	}
	d.say("  sample args: %s", strings.Join(d.sidecars[0].Container.Args, " "))
	if d.noProm != nil {
		return nil
	}
	d.obs, err = startObserver(ctx, d.st.Dir, d.managerMet, d.sidecars)
	if err != nil {
		return fmt.Errorf("starting prometheus: %w", err)
	}
	d.say("  Prometheus %s scrapes the manager (%s) and the 3 sidecars' admin ports every second;", d.obs.srv.URL, d.managerMet)
	d.say("  every target is up. Admitted and refused per second per pod, in a browser:")
	d.say("  Prometheus: %s", d.obs.graphURL())
	return nil
}

// compare is step 4: the same load through Redline and through three in-memory limiters.
func (d *demo) compare(ctx context.Context) error {
	limit := int(d.policy.Spec.Rules[0].Limit.Requests)
	window := d.policy.Spec.Rules[0].Limit.Window.Duration
	sent := replicas * limit
	d.step(4, fmt.Sprintf("Send %d POST %s with one API key, round-robin over the 3 replicas", sent, path))
	if err := d.phase(ctx, phaseBaseline); err != nil {
		return err
	}

	naive, stopNaive, err := startNaiveReplicas(replicas, limit, window, keyHeader, d.upstream.Addr)
	if err != nil {
		return err
	}
	defer stopNaive()
	t := stack.Send(ctx, naive, sent, 12, d.request(d.key()))
	if err := failed(t); err != nil {
		return err
	}
	d.say("  3 replicas with in-memory counters: admitted %s = %d", perTarget(t), t.Admitted)
	d.rows = append(d.rows, row{name: "in-memory limiter x3 (naive)", limit: limit, window: window,
		replicas: replicas, sent: t.Sent, admitted: t.Admitted, callsPerDecision: -1})

	wouldBefore, err := sumMetric(ctx, d.sidecars, "redline_sidecar_candidate_decisions_total", map[string]string{"result": "would_refuse"})
	if err != nil {
		return err
	}
	_, t, err = d.measure(ctx, "Redline (shared counter)", sent)
	if err != nil {
		return err
	}
	d.say("  3 replicas with Redline sidecars:  admitted %s = %d (one shared counter in Redis)", perTarget(t), t.Admitted)
	if err := d.candidateSaid(ctx, sent, wouldBefore); err != nil {
		return err
	}
	d.say("")
	printTable(d.out, d.rows[len(d.rows)-2:])
	d.say("")
	d.say("  Redis calls per decision is below 1: once the key is over its limit, the sidecars answer")
	d.say("  429 from a local pre-check until the window lets requests through again, without asking Redis.")
	return d.phase(ctx, phaseChange)
}

// phase ends the phase under way, printing what Prometheus returned for it, and begins name.
func (d *demo) phase(ctx context.Context, name string) error {
	if d.obs == nil {
		return nil
	}
	ended, err := d.obs.begin(ctx, name)
	if ended != nil {
		d.say("  %s", phaseLine(ended, d.obs.pods))
	}
	return err
}

// observed is step 6: the last phase's numbers, the per-second series from query_range,
// results/demo.json, demo.md and demo.png.
func (d *demo) observed(ctx context.Context) error {
	d.step(6, "Ask Prometheus what it saw")
	if d.obs == nil {
		d.say("  skipped: %v", d.noProm)
		return nil
	}
	ended, err := d.obs.end(ctx)
	if ended != nil {
		d.say("  %s", phaseLine(ended, d.obs.pods))
	}
	if err != nil {
		return err
	}
	d.say("  every phase: Prometheus's admitted and refused per pod equal the client's 2xx and 429 counts")
	data, err := d.obs.timeline(ctx, d.began)
	if err != nil {
		return err
	}
	d.say("  query_range, step 1s: admitted and refused per second per pod add up to the phases' totals")
	if err := writeResults(d.results, data, d.obs.pods, d.rows, d.candidate); err != nil {
		return err
	}
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	png := filepath.Join(d.results, "demo.png")
	// The plotting library lives in hack/bench's module, out of the product's go.mod.
	cmd := exec.CommandContext(ctx, "go", "run", "./cmd/demoplot", "-in", filepath.Join(d.results, "demo.json"), "-out", png)
	cmd.Dir = filepath.Join(root, "hack", "bench")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("drawing %s (go run ./cmd/demoplot in hack/bench): %w\n%s", png, err, out)
	}
	d.say("  wrote %s, demo.md and demo.json (drawn by hack/bench's demoplot)", png)
	return nil
}

func (d *demo) step(n int, title string) {
	_, _ = fmt.Fprintf(d.out, "\n[%d/%d] %s  (%s)\n", n, steps, title, seconds(time.Since(d.began)))
}

func (d *demo) say(format string, args ...any) { _, _ = fmt.Fprintf(d.out, format+"\n", args...) }
