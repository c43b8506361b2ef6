package stack

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sidecarconfig "github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func TestRewriteArg(t *testing.T) {
	sc := &Sidecar{Volumes: map[string]string{"/etc/redline/policies": "/tmp/p", "/etc/redline/podinfo": "/tmp/i"}}
	ports := map[int32]int{8000: 41000, 9091: 41001}
	for _, tc := range []struct{ in, want string }{
		{"--listen=:8000", "--listen=127.0.0.1:41000"},
		{"--admin-listen=0.0.0.0:9091", "--admin-listen=127.0.0.1:41001"},
		{"--upstream=127.0.0.1:8080", "--upstream=127.0.0.1:5555"},
		{"--config-dir=/etc/redline/policies", "--config-dir=/tmp/p"},
		{"--pod-labels=/etc/redline/podinfo/labels", "--pod-labels=/tmp/i/labels"},
		{"--config-dir=/etc/redline/policies-other", "--config-dir=/etc/redline/policies-other"},
		{"--failure-mode=Open", "--failure-mode=Open"},
		{"--verbose", "--verbose"},
		{":8000", "127.0.0.1:41000"}, // a value given as its own argument
	} {
		t.Run(tc.in, func(t *testing.T) {
			NewWithT(t).Expect(sc.rewriteArg(tc.in, ports, 8080, "127.0.0.1:5555")).To(Equal(tc.want))
		})
	}
}

// The labels file must be what the sidecar's parser (the downward API format) reads.
func TestDownwardLabelsRoundTrip(t *testing.T) {
	g := NewWithT(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{
		"app": "shop", "pod-template-hash": "69f4", "quote": `a "b" \c`,
	}}}
	data, err := fieldValue(pod, "metadata.labels")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).To(HavePrefix(`app="shop"` + "\n"))
	parsed, err := sidecarconfig.ParseLabels(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parsed).To(Equal(pod.Labels))

	v, err := fieldValue(pod, "metadata.labels['app']")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(v)).To(Equal("shop"))
	_, err = fieldValue(pod, "status.hostIPs")
	g.Expect(err).To(HaveOccurred())
}

func TestLabelsMatch(t *testing.T) {
	g := NewWithT(t)
	labels := `policy="fail-open",result="allowed",source="failopen"`
	g.Expect(labelsMatch(labels, map[string]string{"policy": "fail-open", "source": "failopen"})).To(BeTrue())
	g.Expect(labelsMatch(labels, map[string]string{"policy": "open"})).To(BeFalse())
	g.Expect(labelsMatch(labels, map[string]string{"result": "refused"})).To(BeFalse())
	g.Expect(labelsMatch(labels, nil)).To(BeTrue())
}

func TestFormatMapSortsKeys(t *testing.T) {
	g := NewWithT(t)
	g.Expect(formatMap(map[string]string{"b": "2", "a": "1"})).To(Equal([]byte("a=\"1\"\nb=\"2\"")))
}

// The injector passes the sidecar its own memory limit through resourceFieldRef; the local
// kubelet resolves it as kubelet does (bytes, rounded up by the divisor), and leaves a limit
// the container does not set unset.
func TestResourceFieldRef(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{
		Name: "redline-sidecar",
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")},
		},
	}}}}
	for _, tc := range []struct {
		ref  corev1.ResourceFieldSelector
		want string
	}{
		{corev1.ResourceFieldSelector{ContainerName: "redline-sidecar", Resource: "limits.memory"}, "67108864"},
		{corev1.ResourceFieldSelector{ContainerName: "redline-sidecar", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}, "64"},
		{corev1.ResourceFieldSelector{ContainerName: "redline-sidecar", Resource: "requests.cpu"}, "1"},
		{corev1.ResourceFieldSelector{ContainerName: "redline-sidecar", Resource: "limits.cpu"}, ""},
	} {
		got, err := resourceValue(pod, &tc.ref)
		if err != nil || got != tc.want {
			t.Errorf("resourceValue(%+v) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
	if _, err := resourceValue(pod, &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory"}); err == nil {
		t.Error("no error for a container the pod does not have")
	}
}
