package helm

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/stack"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// mutatePodPath is where the manager serves pod injection (podinject.Path, config/webhook's
// pod-injector entry); the chart's webhook rules come from config/.
const mutatePodPath = "/mutate-v1-pod"

// installSidecarDefaults are the sidecar.* values of the install test: the manager from the
// chart must accept them and inject them.
var installSidecarDefaults = map[string]any{
	"failureMode": "Closed",
	"resources":   map[string]any{"requests": map[string]any{"cpu": "100m"}},
	"maxProcs":    2, "redisPoolSize": 8, "leaseKeys": 4096, "leaseHorizon": "500ms", "redisTimeout": "100ms",
	"trustedHops": 1,
}

// expectInjectedDefaults sends the manager's webhook (as the API server would, over TLS
// checked against the caBundle it patched) the pod of a tenant's Deployment and checks that
// the chart's sidecar.* values reach the injected sidecar, and that the budget reconciler
// counts the pool the injector gives: the ceiling of 8, not the built-in 16.
func expectInjectedDefaults(g Gomega, ctx context.Context, admin client.Client, mgr *stack.Container, caBundle string) {
	labels := map[string]string{"app": "checkout"}
	tmplAnn := map[string]string{contract.AnnotationInject: "true", contract.AnnotationUpstreamPort: "8080"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: tmplAnn},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.test/checkout:1"}}},
			},
		},
	}
	g.Expect(admin.Create(ctx, dep)).To(Succeed())
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout-7c9d", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: new(true),
		}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: dep.Spec.Selector, Template: dep.Spec.Template},
	}
	g.Expect(admin.Create(ctx, rs)).To(Succeed())

	metricsURL, err := mgr.URL("metrics")
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() (string, error) { return workloadWorstCase(ctx, metricsURL+"/metrics") }).
		WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(Equal("8"),
		"the budget counts checkout at 1 replica x the chart's redisPoolSize 8; manager log:\n%s", mgr.Proc.LogTail(2000))

	// As the ReplicaSet controller makes it: its labels carry the template's hash, which its
	// ReplicaSet's name ends with.
	podLabels := map[string]string{"app": "checkout", appsv1.DefaultDeploymentUniqueLabelKey: "7c9d"}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", GenerateName: rs.Name + "-", Labels: podLabels, Annotations: tmplAnn,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: new(true)}}},
		Spec: *dep.Spec.Template.Spec.DeepCopy(),
	}
	injected := admit(g, ctx, mgr, caBundle, pod)
	var sidecar *corev1.Container
	for _, list := range [][]corev1.Container{injected.Spec.InitContainers, injected.Spec.Containers} {
		for i := range list {
			if list[i].Name == contract.ContainerName {
				sidecar = &list[i]
			}
		}
	}
	g.Expect(sidecar).NotTo(BeNil(), "the manager injected no sidecar")
	g.Expect(sidecar.Args).To(ContainElements("--failure-mode=Closed", "--max-procs=2", "--redis-pool-size=8",
		"--lease-keys=4096", "--lease-horizon=500ms", "--redis-timeout=100ms", "--trusted-hops=1"))
	g.Expect(sidecar.Resources.Requests.Cpu().String()).To(Equal("100m"))
	g.Expect(sidecar.Resources.Limits.Memory().String()).To(Equal("64Mi"), "unset values keep the manager's defaults")
	// The part of podinject.InjectedStatus this test reads.
	var status struct {
		Defaults map[string]string `json:"defaults"`
	}
	g.Expect(json.Unmarshal([]byte(injected.Annotations[contract.AnnotationInjected]), &status)).To(Succeed())
	g.Expect(status.Defaults).To(HaveKeyWithValue("sidecar-failure-mode", "Closed"))
	g.Expect(status.Defaults).To(HaveKeyWithValue("sidecar-trusted-hops", "1"))
	// The patch carries the manager's default pool; the pool the connection budget sizes for the
	// workload reaches the sidecar from the namespace's ConfigMap, under a key the patch names
	// (so that a review of any pod learns no workload's share from the patch).
	g.Expect(status.Defaults).To(HaveKeyWithValue("sidecar-redis-pool-size", "8"), "the manager's default, the pool until the budget's is written")
	var budgetKey string
	for _, e := range sidecar.Env {
		if e.Name == contract.EnvBudgetRedisPoolSize && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
			g.Expect(e.ValueFrom.ConfigMapKeyRef.Name).To(Equal(podinject.RedisConfigMapName))
			g.Expect(e.ValueFrom.ConfigMapKeyRef.Optional).To(Equal(new(true)))
			budgetKey = e.ValueFrom.ConfigMapKeyRef.Key
		}
	}
	g.Expect(budgetKey).To(Equal(podinject.PoolSizeKeyPrefix+".deployment.checkout"), "the budget's pool of the pod's Deployment, from the namespace's ConfigMap")
	g.Eventually(func(g Gomega) string {
		var cm corev1.ConfigMap
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: "shop", Name: podinject.RedisConfigMapName}, &cm)).To(Succeed())
		return cm.Data[budgetKey]
	}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(MatchRegexp(`^[1-8]$`),
		"the manager writes the workload's budget-sized pool (within the chart's ceiling of 8); manager log:\n%s", mgr.Proc.LogTail(2000))
}

// workloadWorstCase is checkout's redline_redis_workload_connections_worst_case on the manager's
// metrics, "" while it is not there.
func workloadWorstCase(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "redline_redis_workload_connections_worst_case{") &&
			strings.Contains(line, `namespace="shop"`) && strings.Contains(line, `name="checkout"`) {
			return line[strings.LastIndexByte(line, ' ')+1:], nil
		}
	}
	return "", nil
}

// admit sends pod to the manager's /mutate-v1-pod and returns it with the response's patch
// applied.
func admit(g Gomega, ctx context.Context, mgr *stack.Container, caBundle string, pod *corev1.Pod) *corev1.Pod {
	raw, err := json.Marshal(pod)
	g.Expect(err).NotTo(HaveOccurred())
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("review-1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: pod.Namespace,
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	g.Expect(err).NotTo(HaveOccurred())

	ca, err := base64.StdEncoding.DecodeString(caBundle)
	g.Expect(err).NotTo(HaveOccurred())
	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(ca)).To(BeTrue(), "the caBundle holds a PEM certificate")
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "redline-webhook-service." + Namespace + ".svc", MinVersion: tls.VersionTLS12,
	}}}
	base, err := mgr.URL("webhook")
	g.Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.Replace(base, "http://", "https://", 1)+mutatePodPath, bytes.NewReader(body))
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred(), "calling the manager's webhook")
	defer func() { _ = resp.Body.Close() }()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	var answer admissionv1.AdmissionReview
	g.Expect(json.NewDecoder(resp.Body).Decode(&answer)).To(Succeed())
	g.Expect(answer.Response).NotTo(BeNil())
	g.Expect(answer.Response.Allowed).To(BeTrue())
	g.Expect(answer.Response.Warnings).To(BeEmpty())
	g.Expect(answer.Response.Patch).NotTo(BeEmpty(), "the webhook did not inject: %s", answer.Response.Result)
	patch, err := jsonpatch.DecodePatch(answer.Response.Patch)
	g.Expect(err).NotTo(HaveOccurred())
	out, err := patch.Apply(raw)
	g.Expect(err).NotTo(HaveOccurred())
	var injected corev1.Pod
	g.Expect(json.Unmarshal(out, &injected)).To(Succeed())
	return &injected
}
