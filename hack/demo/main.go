// Command demo tells Redline's story on this machine in about a minute, with real parts:
// etcd, kube-apiserver and kube-controller-manager, a redis-server, the manager (controller
// and injection webhook) and three sidecars configured from the Pods the webhook injected.
// It compares Redline with three in-memory limiters, changes the policy through the API,
// stops Redis to show the failure mode, and cleans up everything it started, also on Ctrl-C.
//
// Run it with `make demo` (go run ./hack/demo). Flags: -keep leaves the working directory
// (logs, kubeconfig, the sidecars' volume files) in place; -pause keeps everything running
// after the last step, until Ctrl-C, for a look around with kubectl.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
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
)

func main() {
	keep := flag.Bool("keep", false, "keep the working directory (logs, kubeconfig, volume files) after the demo")
	pause := flag.Bool("pause", false, "after the last step, keep everything running until Ctrl-C")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	d := &demo{out: os.Stdout, keep: *keep, pause: *pause, began: time.Now()}
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
	began       time.Time

	st       *stack.Stack
	policy   *v1alpha1.RateLimitPolicy
	pods     []corev1.Pod
	upstream *stack.Upstream
	sidecars []*stack.Sidecar
	proxies  []string
	rows     []row
	keySeq   int
}

func (d *demo) run(ctx context.Context) (err error) {
	d.say("Redline demo: one rate limit shared by every replica of a service.")
	d.say("Everything below runs on this machine: etcd, kube-apiserver, kube-controller-manager,")
	d.say("redis-server, the Redline manager and three Redline sidecars. Nothing is mocked.")

	d.step(1, "Start a local cluster, Redis and the Redline manager")
	st, err := stack.Start(ctx, stack.Options{InstallTools: true, Progress: d.out, KeepDir: d.keep})
	if err != nil {
		return err
	}
	d.st = st
	defer func() {
		d.step(6, "Clean up")
		if stopErr := st.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", stopErr))
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

	steps := []func(context.Context) error{d.deploy, d.runSidecars, d.compare, d.changeAndBreak}
	for _, f := range steps {
		if err := f(ctx); err != nil {
			return err
		}
	}
	if d.pause {
		d.say("\nEverything is still running. In another terminal:")
		d.say("  export KUBECONFIG=%s", st.Kubeconfig)
		d.say("  kubectl -n %s get rlp,deploy,pods,configmap", namespace)
		d.say("  curl -si -X POST -H '%s: me' %s%s", keyHeader, d.proxies[0], path)
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
	if err := d.st.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	if err := d.st.ApplyPolicy(ctx, d.policy); err != nil {
		return err
	}
	r := d.policy.Spec.Rules[0]
	d.say("  applied %s in namespace %s:", samplePolicy, namespace)
	d.say("    %d %s to %s* per %s per value of header %s, algorithm %s, failureMode %s",
		r.Limit.Requests, strings.Join(methods(r), ","), r.Match.PathPrefix, shortDuration(r.Limit.Window.Duration),
		keyHeader, r.Algorithm, d.policy.Spec.FailureMode)
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
	return nil
}

// compare is step 4: the same load through Redline and through three in-memory limiters.
func (d *demo) compare(ctx context.Context) error {
	limit := int(d.policy.Spec.Rules[0].Limit.Requests)
	window := d.policy.Spec.Rules[0].Limit.Window.Duration
	sent := replicas * limit
	d.step(4, fmt.Sprintf("Send %d POST %s with one API key, round-robin over the 3 replicas", sent, path))

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

	_, t, err = d.measure(ctx, "Redline (shared counter)", sent)
	if err != nil {
		return err
	}
	d.say("  3 replicas with Redline sidecars:  admitted %s = %d (one shared counter in Redis)", perTarget(t), t.Admitted)
	d.say("")
	printTable(d.out, d.rows[len(d.rows)-2:])
	d.say("")
	d.say("  Redis calls per decision is below 1: once the key is over its limit, the sidecars answer")
	d.say("  429 from a local pre-check until the window lets requests through again, without asking Redis.")
	return nil
}

// measure sends n requests with a fresh key through the sidecars and records a table row.
func (d *demo) measure(ctx context.Context, name string, n int) (row, stack.Tally, error) {
	rule := d.policy.Spec.Rules[0]
	before, err := sumMetric(ctx, d.sidecars, "redline_sidecar_redis_round_trips_total", nil)
	if err != nil {
		return row{}, stack.Tally{}, err
	}
	t := stack.Send(ctx, d.proxies, n, 12, d.request(d.key()))
	if err := failed(t); err != nil {
		return row{}, t, err
	}
	after, err := sumMetric(ctx, d.sidecars, "redline_sidecar_redis_round_trips_total", nil)
	if err != nil {
		return row{}, t, err
	}
	r := row{name: name, limit: int(rule.Limit.Requests), window: rule.Limit.Window.Duration, replicas: replicas,
		sent: t.Sent, admitted: t.Admitted, callsPerDecision: (after - before) / float64(t.Sent)}
	d.rows = append(d.rows, r)
	return r, t, nil
}

// request builds the demo's request with API key key.
func (d *demo) request(key string) func(int) stack.Request {
	return func(int) stack.Request {
		return stack.Request{Method: http.MethodPost, Path: path, Header: http.Header{keyHeader: {key}}}
	}
}

// key returns an API key not used before, so each measurement starts from an empty counter.
func (d *demo) key() string {
	d.keySeq++
	return fmt.Sprintf("demo-key-%d", d.keySeq)
}

func (d *demo) step(n int, title string) {
	_, _ = fmt.Fprintf(d.out, "\n[%d/6] %s  (%s)\n", n, title, seconds(time.Since(d.began)))
}

func (d *demo) say(format string, args ...any) { _, _ = fmt.Fprintf(d.out, format+"\n", args...) }

func failed(t stack.Tally) error {
	if t.Failed > 0 {
		return fmt.Errorf("%d of %d requests failed; first: %s", t.Failed, t.Sent, t.FirstFailure)
	}
	return nil
}

func methods(r v1alpha1.Rule) []string {
	if r.Match == nil || len(r.Match.Methods) == 0 {
		return []string{"requests"}
	}
	out := make([]string, len(r.Match.Methods))
	for i, m := range r.Match.Methods {
		out[i] = string(m) + "s"
	}
	return out
}

func envNames(env []corev1.EnvVar) string {
	names := make([]string, len(env))
	for i, e := range env {
		names[i] = e.Name
	}
	return strings.Join(names, ",")
}
