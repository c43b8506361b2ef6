package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// This file runs any container of a Pod spec as a process, as RunSidecar does for the injected
// sidecar: the Helm chart's tests start the manager from the chart's rendered Deployment with
// it, so the chart's flags, environment and mounts are proven against the binary.

// Container is a process standing in for one container of a Pod.
type Container struct {
	// Args and Env are what the process was started with.
	Args, Env []string
	// Ports maps each declared container port to the loopback port standing in for it.
	Ports map[int32]int
	// Volumes maps each mount path to the local directory standing in for it.
	Volumes map[string]string
	// Proc is the process.
	Proc *proc.Process

	pod      *corev1.Pod
	ctr      corev1.Container
	stopSync context.CancelFunc
	syncDone chan struct{}
}

// ContainerOptions configure RunContainer.
type ContainerOptions struct {
	// Dir receives the process's log and volume directories.
	Dir string
	// Binary is the executable standing in for the image's command.
	Binary string
	// ExtraEnv is added to the container's resolved environment (what a cluster gives a pod
	// without the spec saying so, e.g. KUBECONFIG for the in-cluster service account).
	ExtraEnv []string
}

// envRef is kubelet's $(VAR) reference in command and args.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnvRefs is args with their $(VAR) references expanded from env (NAME=value), as
// kubelet expands them.
func expandEnvRefs(args, env []string) []string {
	values := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		values[k] = v
	}
	out := make([]string, 0, len(args))
	for _, a := range args {
		out = append(out, envRef.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := values[envRef.FindStringSubmatch(ref)[1]]; ok {
				return v
			}
			return ref // kubelet leaves an undefined reference as written
		}))
	}
	return out
}

// RunContainer starts the container named name of pod as a process of opts.Binary: its args
// with $(VAR) references expanded from its environment, container ports moved to free
// loopback ports and mount paths to local directories; its environment and its ConfigMap,
// Secret, downward-API and emptyDir volumes resolved from the API as kubelet resolves them
// (ConfigMaps and Secrets kept in sync). It returns once the readiness probe passes.
func RunContainer(ctx context.Context, c client.Client, pod *corev1.Pod, name string, opts ContainerOptions) (*Container, error) {
	var ctr *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		return nil, fmt.Errorf("pod %s/%s has no container %s", pod.Namespace, pod.Name, name)
	}
	rc := &Container{pod: pod.DeepCopy(), ctr: *ctr.DeepCopy(), Ports: map[int32]int{}, Volumes: map[string]string{}}
	for _, p := range ctr.Ports {
		if _, ok := rc.Ports[p.ContainerPort]; ok {
			continue // one port under two names
		}
		free, err := redistest.FreePort()
		if err != nil {
			return nil, fmt.Errorf("choosing a port for %s: %w", p.Name, err)
		}
		rc.Ports[p.ContainerPort] = free
	}
	var syncers []func(context.Context)
	for _, m := range ctr.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, fmt.Errorf("volume mount %s uses subPath, which the local stack does not support", m.Name)
		}
		local := filepath.Join(opts.Dir, "volumes", name, m.Name)
		rc.Volumes[m.MountPath] = local
		sync, err := writeVolume(ctx, c, pod, m.Name, local)
		if err != nil {
			return nil, err
		}
		if sync != nil {
			syncers = append(syncers, sync)
		}
	}
	env, err := resolveEnv(ctx, c, pod, ctr)
	if err != nil {
		return nil, fmt.Errorf("pod %s container %s: %w", pod.Name, name, err)
	}
	rc.Env = append(append([]string{"HOSTNAME=" + pod.Name}, env...), opts.ExtraEnv...)
	for _, a := range expandEnvRefs(ctr.Args, env) {
		rc.Args = append(rc.Args, rc.rewriteArg(a))
	}

	syncCtx, cancel := context.WithCancel(context.Background())
	rc.stopSync, rc.syncDone = cancel, make(chan struct{})
	go func() {
		defer close(rc.syncDone)
		for {
			select {
			case <-syncCtx.Done():
				return
			case <-time.After(configMapSyncInterval):
			}
			for _, f := range syncers {
				f(syncCtx)
			}
		}
	}()
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		rc.stopSyncing()
		return nil, fmt.Errorf("creating %s: %w", opts.Dir, err)
	}
	p, err := proc.Start(opts.Dir, name, opts.Binary, rc.Args, rc.Env)
	if err != nil {
		rc.stopSyncing()
		return nil, err
	}
	rc.Proc = p
	if err := rc.waitReady(ctx); err != nil {
		_ = rc.Stop()
		return nil, err
	}
	return rc, nil
}

// rewriteArg moves a mount path (or a path under it) to its local directory and a container
// port (":8080", "0.0.0.0:8080" or "8080" as a flag value) to its loopback port.
func (rc *Container) rewriteArg(arg string) string {
	prefix, value := "", arg
	if strings.HasPrefix(arg, "-") {
		name, v, ok := strings.Cut(arg, "=")
		if !ok {
			return arg
		}
		prefix, value = name+"=", v
	}
	for mount, local := range rc.Volumes {
		if value == mount || strings.HasPrefix(value, mount+"/") {
			return prefix + local + strings.TrimPrefix(value, mount)
		}
	}
	port := value
	if _, p, err := net.SplitHostPort(value); err == nil {
		port = p
	}
	if n, err := strconv.Atoi(port); err == nil {
		if local, ok := rc.Ports[int32(n)]; ok {
			if port == value {
				return prefix + strconv.Itoa(local)
			}
			return prefix + "127.0.0.1:" + strconv.Itoa(local)
		}
	}
	return arg
}

// URL is http://127.0.0.1:<the loopback port of the container port named portName>.
func (rc *Container) URL(portName string) (string, error) {
	for _, p := range rc.ctr.Ports {
		if p.Name == portName {
			return "http://127.0.0.1:" + strconv.Itoa(rc.Ports[p.ContainerPort]), nil
		}
	}
	return "", fmt.Errorf("container %s declares no port %s", rc.ctr.Name, portName)
}

func (rc *Container) waitReady(ctx context.Context) error {
	probe := rc.ctr.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		return fmt.Errorf("container %s has no HTTP readiness probe to wait for", rc.ctr.Name)
	}
	url := probeURL(probe, rc.ctr.Ports, rc.Ports)
	if err := rc.Proc.WaitHTTP(ctx, url, time.Minute, 100*time.Millisecond); err != nil {
		return fmt.Errorf("waiting for container %s to be ready: %w", rc.ctr.Name, err)
	}
	return nil
}

// Stop ends the process gracefully (SIGTERM, as kubelet does) and stops syncing its volumes.
func (rc *Container) Stop() error {
	rc.stopSyncing()
	if rc.Proc == nil {
		return nil
	}
	return rc.Proc.Stop(10 * time.Second)
}

func (rc *Container) stopSyncing() {
	if rc.stopSync != nil {
		rc.stopSync()
		<-rc.syncDone
		rc.stopSync = nil
	}
}

// writeVolume writes the volume named name of pod into local and returns, for a ConfigMap or
// Secret volume, the function that keeps it in sync.
func writeVolume(ctx context.Context, c client.Client, pod *corev1.Pod, name, local string) (func(context.Context), error) {
	var vol *corev1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			vol = &pod.Spec.Volumes[i]
		}
	}
	var read func(context.Context) (map[string][]byte, string, error)
	switch {
	case vol == nil:
		return nil, fmt.Errorf("pod %s mounts volume %s, which it does not declare", pod.Name, name)
	case vol.DownwardAPI != nil:
		files, err := downwardFiles(pod, vol.DownwardAPI)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		return nil, kubeletdir.Write(local, files)
	case vol.EmptyDir != nil:
		return nil, kubeletdir.Write(local, map[string][]byte{})
	case vol.ConfigMap != nil:
		src := vol.ConfigMap.DeepCopy()
		read = func(ctx context.Context) (map[string][]byte, string, error) {
			return configMapFiles(ctx, c, pod.Namespace, src)
		}
	case vol.Secret != nil:
		src := vol.Secret.DeepCopy()
		read = func(ctx context.Context) (map[string][]byte, string, error) {
			return secretFiles(ctx, c, pod.Namespace, src)
		}
	default:
		return nil, fmt.Errorf("volume %s: only ConfigMap, Secret, downward API and emptyDir volumes are supported by the local stack", name)
	}
	files, version, err := read(ctx)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	if err := kubeletdir.Write(local, files); err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	return func(ctx context.Context) {
		files, v, err := read(ctx)
		if err != nil || v == version {
			return // an API hiccup is retried on the next tick, as kubelet does
		}
		if kubeletdir.Write(local, files) == nil {
			version = v
		}
	}, nil
}
