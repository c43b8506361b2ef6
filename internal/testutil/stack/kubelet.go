package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// This file plays kubelet's part for the sidecar processes: volume contents laid out as
// kubelet's atomic writer lays them out, downward-API values and environment variables.

// formatMap renders labels or annotations as the downward API does: key="value" lines sorted
// by key, the value quoted.
func formatMap(m map[string]string) []byte {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return []byte(b.String())
}

// fieldValue resolves a downward-API field path of pod.
func fieldValue(pod *corev1.Pod, path string) ([]byte, error) {
	switch path {
	case "metadata.name":
		return []byte(pod.Name), nil
	case "metadata.namespace":
		return []byte(pod.Namespace), nil
	case "metadata.uid":
		return []byte(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return []byte(pod.Spec.NodeName), nil
	case "spec.serviceAccountName":
		return []byte(pod.Spec.ServiceAccountName), nil
	case "status.podIP":
		return []byte("127.0.0.1"), nil // every local sidecar lives on loopback
	}
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if key, ok := strings.CutPrefix(path, prefix); ok && strings.HasSuffix(key, "']") {
			key = strings.TrimSuffix(key, "']")
			if prefix == "metadata.labels['" {
				return []byte(pod.Labels[key]), nil
			}
			return []byte(pod.Annotations[key]), nil
		}
	}
	return nil, fmt.Errorf("downward API field %q is not supported by the local stack", path)
}

// downwardFiles renders a downward-API volume of pod.
func downwardFiles(pod *corev1.Pod, src *corev1.DownwardAPIVolumeSource) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, item := range src.Items {
		if item.FieldRef == nil {
			return nil, fmt.Errorf("downward API item %s: only fieldRef is supported by the local stack", item.Path)
		}
		v, err := fieldValue(pod, item.FieldRef.FieldPath)
		if err != nil {
			return nil, err
		}
		files[item.Path] = v
	}
	return files, nil
}

// configMapFiles reads a ConfigMap volume's payload: every key, or the listed items. A missing
// optional ConfigMap is an empty volume, as kubelet has it.
func configMapFiles(ctx context.Context, c client.Client, namespace string, src *corev1.ConfigMapVolumeSource) (map[string][]byte, string, error) {
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: src.Name}, &cm)
	if apierrors.IsNotFound(err) && src.Optional != nil && *src.Optional {
		return map[string][]byte{}, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading ConfigMap %s/%s for a volume: %w", namespace, src.Name, err)
	}
	all := map[string][]byte{}
	for k, v := range cm.Data {
		all[k] = []byte(v)
	}
	maps.Copy(all, cm.BinaryData)
	if len(src.Items) == 0 {
		return all, cm.ResourceVersion, nil
	}
	files := map[string][]byte{}
	for _, item := range src.Items {
		if v, ok := all[item.Key]; ok {
			files[item.Path] = v
		}
	}
	return files, cm.ResourceVersion, nil
}

// secretFiles reads a Secret volume's payload: every key, or the listed items (a listed key the
// Secret lacks is left out when the volume is optional). A missing optional Secret is an empty
// volume, as kubelet has it.
func secretFiles(ctx context.Context, c client.Client, namespace string, src *corev1.SecretVolumeSource) (map[string][]byte, string, error) {
	var sec corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: src.SecretName}, &sec)
	optional := src.Optional != nil && *src.Optional
	if apierrors.IsNotFound(err) && optional {
		return map[string][]byte{}, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading Secret %s/%s for a volume: %w", namespace, src.SecretName, err)
	}
	if len(src.Items) == 0 {
		return maps.Clone(sec.Data), sec.ResourceVersion, nil
	}
	files := map[string][]byte{}
	for _, item := range src.Items {
		v, ok := sec.Data[item.Key]
		if !ok && !optional {
			return nil, "", fmt.Errorf("secret %s/%s has no key %s", namespace, src.SecretName, item.Key)
		}
		if ok {
			files[item.Path] = v
		}
	}
	return files, sec.ResourceVersion, nil
}

// errNotYet marks an environment source that does not exist yet (a ConfigMap or Secret, or
// one of its keys): kubelet retries the container until it does.
var errNotYet = errors.New("not there yet")

// resolveEnvWhenReady is resolveEnv, retried while a source it reads does not exist yet (as
// kubelet retries a container in CreateContainerConfigError), until ctx ends.
func resolveEnvWhenReady(ctx context.Context, c client.Client, pod *corev1.Pod, ctr *corev1.Container) ([]string, error) {
	var env []string
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		env, last = resolveEnv(ctx, c, pod, ctr)
		if errors.Is(last, errNotYet) {
			return false, nil
		}
		return true, last
	})
	if err != nil && last != nil {
		return nil, last
	}
	return env, err
}

// resolveEnv computes a container's environment as kubelet would: literal values, downward-API
// fields, and keys of Secrets and ConfigMaps (optional ones may be absent).
func resolveEnv(ctx context.Context, c client.Client, pod *corev1.Pod, ctr *corev1.Container) ([]string, error) {
	var env []string
	for _, e := range ctr.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
			continue
		}
		v, ok, err := resolveEnvSource(ctx, c, pod, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("environment variable %s: %w", e.Name, err)
		}
		if ok {
			env = append(env, e.Name+"="+v)
		}
	}
	return env, nil
}

func resolveEnvSource(ctx context.Context, c client.Client, pod *corev1.Pod, src *corev1.EnvVarSource) (string, bool, error) {
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: pod.Namespace, Name: name} }
	switch {
	case src.FieldRef != nil:
		v, err := fieldValue(pod, src.FieldRef.FieldPath)
		return string(v), err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(pod, src.ResourceFieldRef)
		return v, err == nil && v != "", err
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		var s corev1.Secret
		err := c.Get(ctx, key(ref.Name), &s)
		if err == nil {
			if v, ok := s.Data[ref.Key]; ok {
				return string(v), true, nil
			}
		}
		if (err == nil || apierrors.IsNotFound(err)) && ref.Optional != nil && *ref.Optional {
			return "", false, nil
		}
		if err == nil || apierrors.IsNotFound(err) {
			err = fmt.Errorf("secret %s, key %s: %w", ref.Name, ref.Key, errNotYet)
		}
		return "", false, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		var cm corev1.ConfigMap
		err := c.Get(ctx, key(ref.Name), &cm)
		if err == nil {
			if v, ok := cm.Data[ref.Key]; ok {
				return v, true, nil
			}
		}
		if (err == nil || apierrors.IsNotFound(err)) && ref.Optional != nil && *ref.Optional {
			return "", false, nil
		}
		if err == nil || apierrors.IsNotFound(err) {
			err = fmt.Errorf("ConfigMap %s, key %s: %w", ref.Name, ref.Key, errNotYet)
		}
		return "", false, err
	}
	return "", false, errors.New("unsupported valueFrom (the local stack resolves fieldRef, resourceFieldRef, secretKeyRef and configMapKeyRef)")
}

// resourceValue is a container's request or limit (resourceFieldRef) divided by the divisor,
// rounded up, as kubelet computes it. A limit the container does not set is kubelet's node
// allocatable; the local stack has no node, so the variable is left unset ("").
func resourceValue(pod *corev1.Pod, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("resourceFieldRef %q: want limits.<resource> or requests.<resource>", ref.Resource)
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != ref.ContainerName {
			continue
		}
		list := c.Resources.Limits
		if kind == "requests" {
			list = c.Resources.Requests
		}
		q, ok := list[corev1.ResourceName(name)]
		if !ok {
			return "", nil
		}
		divisor := resource.MustParse("1")
		if !ref.Divisor.IsZero() {
			divisor = ref.Divisor
		}
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return "", fmt.Errorf("resourceFieldRef: no container %q in the pod", ref.ContainerName)
}
