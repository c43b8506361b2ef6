package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// fieldOwner names the stack in managedFields, as kubectl does for itself.
const fieldOwner = client.FieldOwner("redline-stack")

// CreateNamespace creates a namespace (and is happy when it exists).
func (s *Stack) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := s.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// ApplyPolicy creates or updates a RateLimitPolicy with server-side apply, as
// `kubectl apply --server-side` does. Its apiVersion and kind are filled in.
func (s *Stack) ApplyPolicy(ctx context.Context, p *v1alpha1.RateLimitPolicy) error {
	obj := p.DeepCopy()
	obj.APIVersion = v1alpha1.GroupVersion.String()
	obj.Kind = "RateLimitPolicy"
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("converting RateLimitPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	// Only what a manifest would say: no status, no server-set metadata.
	delete(u, "status")
	md, _ := u["metadata"].(map[string]any)
	for _, k := range []string{"creationTimestamp", "resourceVersion", "uid", "generation", "managedFields"} {
		delete(md, k)
	}
	ac := client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u})
	if err := s.Client.Apply(ctx, ac, fieldOwner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying RateLimitPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// DeletePolicy deletes a RateLimitPolicy (and is happy when it is gone).
func (s *Stack) DeletePolicy(ctx context.Context, namespace, name string) error {
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := s.Client.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting RateLimitPolicy %s/%s: %w", namespace, name, err)
	}
	return nil
}

// WaitProgrammed waits until the policy's status describes its current generation with
// Programmed=True, and returns it.
func (s *Stack) WaitProgrammed(ctx context.Context, namespace, name string, timeout time.Duration) (*v1alpha1.RateLimitPolicy, error) {
	var p v1alpha1.RateLimitPolicy
	var last string
	err := poll(ctx, timeout, 100*time.Millisecond, func() (bool, error) {
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &p); err != nil {
			last = err.Error()
			return false, nil
		}
		c := meta.FindStatusCondition(p.Status.Conditions, "Programmed")
		if c == nil {
			last = "no Programmed condition yet"
			return false, nil
		}
		last = fmt.Sprintf("Programmed=%s reason %s: %s", c.Status, c.Reason, c.Message)
		return p.Status.ObservedGeneration == p.Generation && c.ObservedGeneration == p.Generation &&
			c.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for RateLimitPolicy %s/%s to be Programmed (%s): %w", namespace, name, last, err)
	}
	return &p, nil
}

// PoliciesDocument reads and parses the namespace's compiled ConfigMap.
func (s *Stack) PoliciesDocument(ctx context.Context, namespace string) (*policydoc.Document, *corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: policydoc.ConfigMapName}, &cm); err != nil {
		return nil, nil, fmt.Errorf("reading ConfigMap %s/%s: %w", namespace, policydoc.ConfigMapName, err)
	}
	doc, err := policydoc.Parse([]byte(cm.Data[policydoc.DataKey]))
	if err != nil {
		return nil, &cm, fmt.Errorf("ConfigMap %s/%s: %w", namespace, policydoc.ConfigMapName, err)
	}
	return doc, &cm, nil
}

// App describes a Deployment that opts in to injection.
type App struct {
	Namespace, Name string
	// Replicas of the Deployment.
	Replicas int32
	// Labels of the pod template (and the Deployment's selector).
	Labels map[string]string
	// UpstreamPort is the application's port (annotation redline.dev/upstream-port).
	UpstreamPort int32
	// Annotations are added to the pod template's (e.g. redline.dev/failure-mode).
	Annotations map[string]string
}

// CreateDeployment creates the Deployment of app, annotated for injection. Its container
// image is never pulled: there is no kubelet, and the stack runs the sidecars itself.
func (s *Stack) CreateDeployment(ctx context.Context, app App) error {
	ann := map[string]string{
		contract.AnnotationInject:       "true",
		contract.AnnotationUpstreamPort: strconv.Itoa(int(app.UpstreamPort)),
	}
	maps.Copy(ann, app.Annotations)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name, Labels: app.Labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(app.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: app.Labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: app.Labels, Annotations: ann},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "app",
					Image: "example.invalid/" + app.Name + ":1",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: app.UpstreamPort}},
				}}},
			},
		},
	}
	if err := s.Client.Create(ctx, d); err != nil {
		return fmt.Errorf("creating Deployment %s/%s: %w", app.Namespace, app.Name, err)
	}
	return nil
}

// WaitPods waits until the app's Deployment has its Pods (created by kube-controller-manager)
// and returns them sorted by name. It fails when a Pod came back without the sidecar: the
// webhook's failurePolicy is Ignore, so a webhook the API server cannot reach shows only here.
func (s *Stack) WaitPods(ctx context.Context, app App, timeout time.Duration) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	var last string
	err := poll(ctx, timeout, 100*time.Millisecond, func() (bool, error) {
		var list corev1.PodList
		if err := s.Client.List(ctx, &list, client.InNamespace(app.Namespace), client.MatchingLabels(app.Labels)); err != nil {
			last = err.Error()
			return false, nil
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		last = fmt.Sprintf("%d of %d pods", len(pods), app.Replicas)
		return len(pods) == int(app.Replicas), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the pods of Deployment %s/%s (%s; is kube-controller-manager running? log %s): %w",
			app.Namespace, app.Name, last, s.kcm.LogPath, err)
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for i := range pods {
		if _, ok := SidecarContainer(&pods[i]); !ok {
			return nil, fmt.Errorf("pod %s/%s has no %s container: the webhook did not inject it (manager log %s)",
				pods[i].Namespace, pods[i].Name, contract.ContainerName, s.Manager.LogPath)
		}
	}
	return pods, nil
}

// SidecarContainer returns the injected sidecar of pod (a native sidecar among the init
// containers, or a regular container) and whether there is one.
func SidecarContainer(pod *corev1.Pod) (*corev1.Container, bool) {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == contract.ContainerName {
			return &pod.Spec.InitContainers[i], true
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == contract.ContainerName {
			return &pod.Spec.Containers[i], true
		}
	}
	return nil, false
}

// errTimeout is returned by poll when the condition never held.
var errTimeout = errors.New("timed out")

// probeURL is the loopback URL of an HTTP probe: its port, by number or by the name of one of
// the declared ports, mapped to the loopback port standing in for it.
func probeURL(probe *corev1.Probe, declared []corev1.ContainerPort, mapped map[int32]int) string {
	port := probe.HTTPGet.Port.IntVal
	if probe.HTTPGet.Port.Type == intstr.String {
		for _, p := range declared {
			if p.Name == probe.HTTPGet.Port.StrVal {
				port = p.ContainerPort
			}
		}
	}
	return fmt.Sprintf("http://127.0.0.1:%d%s", mapped[port], probe.HTTPGet.Path)
}

// poll calls cond every interval until it returns true or an error, ctx ends or timeout passes.
func poll(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s", errTimeout, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
