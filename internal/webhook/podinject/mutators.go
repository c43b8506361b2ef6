package podinject

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// InjectedVersion is the format version recorded in the contract.AnnotationInjected annotation.
// It changes when what the injector adds changes incompatibly.
const InjectedVersion = 1

// InjectedStatus is the value of the contract.AnnotationInjected annotation (JSON): enough to
// tell, from the pod alone, how and with what it was injected.
type InjectedStatus struct {
	// Version is InjectedVersion.
	Version int `json:"version"`
	// Native is true when the sidecar is an init container with restartPolicy Always.
	Native bool `json:"native"`
	// Image is the sidecar's image.
	Image string `json:"image"`
	// Hash is a short SHA-256 of the injected container and volumes.
	Hash string `json:"hash"`
	// Defaults are the manager's cluster-wide --sidecar-* defaults the sidecar got (flag name
	// without dashes -> value), where the pod's annotations did not set the same; empty when it
	// runs on its annotations and the built-in defaults only.
	Defaults map[string]string `json:"defaults,omitempty"`
}

// injection is what the mutators add to one pod.
type injection struct {
	container corev1.Container
	volumes   []corev1.Volume
	native    bool
	// upstream is the application's port (redline.dev/upstream-port).
	upstream int32
	// defaults are the manager's --sidecar-* defaults applied (see InjectedStatus.Defaults).
	defaults map[string]string
}

// mutator changes one part of a pod. Each mutator is idempotent: applying it to a pod it has
// already changed changes nothing more.
type mutator interface {
	name() string
	mutate(pod *corev1.Pod, inj *injection) error
}

// defaultMutators is the chain applied to every pod that is injected, in order.
func defaultMutators() []mutator {
	return []mutator{portHandoverMutator{}, containerMutator{}, volumeMutator{}, statusMutator{}}
}

// containerMutator puts the sidecar first among the init containers (native) or last among the
// containers (regular: kubectl's default container stays the application's), replacing an
// earlier sidecar wherever it is.
type containerMutator struct{}

func (containerMutator) name() string { return "container" }

func (containerMutator) mutate(pod *corev1.Pod, inj *injection) error {
	notSidecar := func(c corev1.Container) bool { return c.Name != contract.ContainerName }
	pod.Spec.InitContainers = slices.DeleteFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return !notSidecar(c) })
	pod.Spec.Containers = slices.DeleteFunc(pod.Spec.Containers, func(c corev1.Container) bool { return !notSidecar(c) })
	if inj.native {
		pod.Spec.InitContainers = slices.Insert(pod.Spec.InitContainers, 0, inj.container)
	} else {
		pod.Spec.Containers = append(pod.Spec.Containers, inj.container)
	}
	if len(pod.Spec.InitContainers) == 0 {
		pod.Spec.InitContainers = nil
	}
	return nil
}

// volumeMutator adds the sidecar's volumes, replacing volumes of the same names.
type volumeMutator struct{}

func (volumeMutator) name() string { return "volumes" }

func (volumeMutator) mutate(pod *corev1.Pod, inj *injection) error {
	for _, v := range inj.volumes {
		i := slices.IndexFunc(pod.Spec.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name })
		if i >= 0 {
			pod.Spec.Volumes[i] = v
		} else {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		}
	}
	return nil
}

// statusMutator records what was injected, which makes later admissions of the same pod (and
// copies of it) leave it alone.
type statusMutator struct{}

func (statusMutator) name() string { return "status" }

func (statusMutator) mutate(pod *corev1.Pod, inj *injection) error {
	value, err := statusValue(inj)
	if err != nil {
		return err
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[contract.AnnotationInjected] = value
	return nil
}

func statusValue(inj *injection) (string, error) {
	content, err := json.Marshal(struct {
		C corev1.Container `json:"c"`
		V []corev1.Volume  `json:"v"`
	}{inj.container, inj.volumes})
	if err != nil {
		return "", fmt.Errorf("hashing the injected spec: %w", err)
	}
	sum := sha256.Sum256(content)
	out, err := json.Marshal(InjectedStatus{
		Version: InjectedVersion, Native: inj.native, Image: inj.container.Image, Hash: hex.EncodeToString(sum[:8]), Defaults: inj.defaults,
	})
	if err != nil {
		return "", fmt.Errorf("encoding the injected status: %w", err)
	}
	return string(out), nil
}
