package stack

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// configMapSyncInterval is how often a ConfigMap volume is compared with the API (kubelet
// takes up to a minute; the stack is quicker so tests wait for Redline, not for it).
const configMapSyncInterval = 200 * time.Millisecond

// Sidecar is a sidecar process standing in for the injected container of one Pod.
type Sidecar struct {
	// Pod is the Pod as stored, with the container the webhook injected.
	Pod corev1.Pod
	// Container is the injected sidecar container.
	Container corev1.Container
	// Args and Env are what the process was started with.
	Args, Env []string
	// ProxyURL is the proxy face (the listen port); AdminURL serves health and metrics;
	// CheckURL serves /v1/check.
	ProxyURL, AdminURL, CheckURL string
	// Volumes maps each mount path of the container to the local directory standing in for it.
	Volumes map[string]string
	// Proc is the process.
	Proc *proc.Process

	stopSync context.CancelFunc
	syncDone chan struct{}
}

// RunSidecars starts one sidecar per Pod (see RunSidecar) and waits until all are ready.
func (s *Stack) RunSidecars(ctx context.Context, pods []corev1.Pod, upstreamAddr string) ([]*Sidecar, error) {
	out := make([]*Sidecar, 0, len(pods))
	for i := range pods {
		sc, err := s.RunSidecar(ctx, &pods[i], upstreamAddr)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

// RunSidecar starts the sidecar binary configured exactly as pod's injected container says:
// its args, with container ports moved to free loopback ports, the upstream port pointed at
// upstreamAddr and mount paths replaced by local directories; its environment resolved as
// kubelet resolves it; its volumes written in kubelet's layout and kept in sync with the
// ConfigMap. It returns once the container's readiness probe passes.
func (s *Stack) RunSidecar(ctx context.Context, pod *corev1.Pod, upstreamAddr string) (*Sidecar, error) {
	ctr, ok := SidecarContainer(pod)
	if !ok {
		return nil, fmt.Errorf("pod %s/%s has no %s container", pod.Namespace, pod.Name, contract.ContainerName)
	}
	sc := &Sidecar{Pod: *pod.DeepCopy(), Container: *ctr.DeepCopy(), Volumes: map[string]string{}}
	podDir := s.path("pods", pod.Name)

	ports, err := sc.choosePorts(ctr)
	if err != nil {
		return nil, err
	}
	upstreamPort, _ := strconv.Atoi(pod.Annotations[contract.AnnotationUpstreamPort])

	if err := s.mountVolumes(ctx, sc, pod, ctr, podDir); err != nil {
		return nil, err
	}
	s.addCleanup(func() error { sc.stopSyncing(); return nil })

	env, err := resolveEnvWhenReady(ctx, s.Client, pod, ctr)
	if err != nil {
		sc.stopSyncing()
		return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	for _, a := range expandEnvRefs(append(append([]string{}, ctr.Command...), ctr.Args...), env) {
		sc.Args = append(sc.Args, sc.rewriteArg(a, ports, upstreamPort, upstreamAddr))
	}
	// kubelet sets HOSTNAME to the pod's name; nothing of this machine's environment leaks in.
	sc.Env = append([]string{"HOSTNAME=" + pod.Name}, env...)

	p, err := proc.Start(s.Dir, "sidecar-"+pod.Name, s.Bin.Sidecar, sc.Args, sc.Env)
	if err != nil {
		sc.stopSyncing()
		return nil, err
	}
	sc.Proc = p
	s.addCleanup(func() error { return sc.Stop() })
	if err := sc.waitReady(ctx, ports); err != nil {
		return nil, err
	}
	return sc, nil
}

// choosePorts gives every declared container port a free loopback port. A port declared twice
// under two names (the injector's port handover) is one port, as in a pod.
func (sc *Sidecar) choosePorts(ctr *corev1.Container) (map[int32]int, error) {
	ports := map[int32]int{}
	for _, p := range ctr.Ports {
		free, ok := ports[p.ContainerPort]
		if !ok {
			var err error
			if free, err = redistest.FreePort(); err != nil {
				return nil, fmt.Errorf("choosing a port for %s: %w", p.Name, err)
			}
			ports[p.ContainerPort] = free
		}
		switch p.Name {
		case contract.ListenPortName:
			sc.ProxyURL = "http://127.0.0.1:" + strconv.Itoa(free)
		case contract.AdminPortName:
			sc.AdminURL = "http://127.0.0.1:" + strconv.Itoa(free)
		}
	}
	// The decision faces listen on loopback unless the pod exposes them, so they are not
	// declared container ports; on this machine every sidecar still needs ports of its own.
	for _, port := range []int32{contract.CheckPort, contract.GRPCPort} {
		if _, ok := ports[port]; !ok {
			free, err := redistest.FreePort()
			if err != nil {
				return nil, fmt.Errorf("choosing a port for %d: %w", port, err)
			}
			ports[port] = free
		}
	}
	sc.CheckURL = "http://127.0.0.1:" + strconv.Itoa(ports[contract.CheckPort])
	return ports, nil
}

// mountVolumes writes ctr's volumes under podDir in kubelet's layout and keeps them in sync
// with their sources until sc stops syncing.
func (s *Stack) mountVolumes(ctx context.Context, sc *Sidecar, pod *corev1.Pod, ctr *corev1.Container, podDir string) error {
	syncCtx, cancel := context.WithCancel(context.Background())
	sc.stopSync, sc.syncDone = cancel, make(chan struct{})
	var syncers []func()
	for _, m := range ctr.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			cancel()
			return fmt.Errorf("volume mount %s uses subPath, which the local stack does not support", m.Name)
		}
		local := filepath.Join(podDir, "volumes", m.Name)
		sc.Volumes[m.MountPath] = local
		sync, err := s.prepareVolume(ctx, pod, m.Name, local)
		if err != nil {
			cancel()
			return err
		}
		if sync != nil {
			syncers = append(syncers, func() { sync(syncCtx) })
		}
	}
	go func() {
		defer close(sc.syncDone)
		for {
			select {
			case <-syncCtx.Done():
				return
			case <-time.After(configMapSyncInterval):
			}
			for _, f := range syncers {
				f()
			}
		}
	}()
	return nil
}

// prepareVolume writes the volume named name of pod into local and returns, for a ConfigMap or
// Secret volume, the function that keeps it in sync.
func (s *Stack) prepareVolume(ctx context.Context, pod *corev1.Pod, name, local string) (func(context.Context), error) {
	var vol *corev1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			vol = &pod.Spec.Volumes[i]
		}
	}
	switch {
	case vol == nil:
		return nil, fmt.Errorf("pod %s mounts volume %s, which it does not declare", pod.Name, name)
	case vol.DownwardAPI != nil:
		files, err := downwardFiles(pod, vol.DownwardAPI)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		return nil, kubeletdir.Write(local, files)
	case vol.ConfigMap != nil:
		src := vol.ConfigMap.DeepCopy()
		files, version, err := configMapFiles(ctx, s.Client, pod.Namespace, src)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		if err := kubeletdir.Write(local, files); err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		return func(ctx context.Context) {
			files, v, err := configMapFiles(ctx, s.Client, pod.Namespace, src)
			if err != nil || v == version {
				return // an API hiccup is retried on the next tick, as kubelet does
			}
			if kubeletdir.Write(local, files) == nil {
				version = v
			}
		}, nil
	case vol.Secret != nil:
		src := vol.Secret.DeepCopy()
		files, version, err := secretFiles(ctx, s.Client, pod.Namespace, src)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		if err := kubeletdir.Write(local, files); err != nil {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		return func(ctx context.Context) {
			files, v, err := secretFiles(ctx, s.Client, pod.Namespace, src)
			if err != nil || v == version {
				return
			}
			if kubeletdir.Write(local, files) == nil {
				version = v
			}
		}, nil
	case vol.EmptyDir != nil:
		return nil, kubeletdir.Write(local, map[string][]byte{})
	}
	return nil, fmt.Errorf("volume %s: only ConfigMap, Secret, downward API and emptyDir volumes are supported by the local stack", name)
}

// rewriteArg moves what an argument says about the Pod's world to this machine: a mount path
// (or a path under it) to its local directory, a container port to its loopback port and the
// upstream port to the local upstream.
func (sc *Sidecar) rewriteArg(arg string, ports map[int32]int, upstreamPort int, upstreamAddr string) string {
	prefix, value := "", arg
	if strings.HasPrefix(arg, "-") {
		name, v, ok := strings.Cut(arg, "=")
		if !ok {
			return arg
		}
		prefix, value = name+"=", v
	}
	for mount, local := range sc.Volumes {
		if value == mount || strings.HasPrefix(value, mount+"/") {
			return prefix + local + strings.TrimPrefix(value, mount)
		}
	}
	if _, port, err := net.SplitHostPort(value); err == nil {
		if n, err := strconv.Atoi(port); err == nil {
			if local, ok := ports[int32(n)]; ok {
				return prefix + "127.0.0.1:" + strconv.Itoa(local)
			}
			if n == upstreamPort {
				return prefix + upstreamAddr
			}
		}
	}
	return arg
}

// waitReady polls the container's readiness probe (HTTP GET on the mapped port).
func (sc *Sidecar) waitReady(ctx context.Context, ports map[int32]int) error {
	probe := sc.Container.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		return fmt.Errorf("sidecar of pod %s has no HTTP readiness probe to wait for", sc.Pod.Name)
	}
	url := probeURL(probe, sc.Container.Ports, ports)
	if err := sc.Proc.WaitHTTP(ctx, url, 30*time.Second, 50*time.Millisecond); err != nil {
		return fmt.Errorf("waiting for the sidecar of pod %s to be ready: %w", sc.Pod.Name, err)
	}
	return nil
}

// Stop ends the sidecar gracefully (SIGTERM, as kubelet does) and stops syncing its volumes.
func (sc *Sidecar) Stop() error {
	sc.stopSyncing()
	if sc.Proc == nil {
		return nil
	}
	return sc.Proc.Stop(10 * time.Second)
}

// FreezeVolumes stops updating the sidecar's ConfigMap and Secret volumes: the files stay as
// they are, as with a kubelet that is behind on its volume sync (it may take a minute).
func (sc *Sidecar) FreezeVolumes() { sc.stopSyncing() }

func (sc *Sidecar) stopSyncing() {
	sc.stopSync()
	<-sc.syncDone
}
