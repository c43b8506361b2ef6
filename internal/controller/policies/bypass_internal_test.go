package policies

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// A namespace's Services and templates are the tenant's to multiply: the check of one policy
// looks at maxBypassPairs of them at most, whatever their product.
func TestServiceBypassesLooksAtABoundedNumberOfPairs(t *testing.T) {
	g := NewWithT(t)
	p := &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{
		TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
	}}
	tmpl := injectedTemplate{workload: "Deployment web", labels: map[string]string{"app": "web"}, upstream: 8080, listen: 8000}
	svc := func(name string, target int32) corev1.Service {
		return corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(target)}}},
		}
	}
	services := make([]corev1.Service, maxBypassPairs+1)
	for i := range services {
		services[i] = svc("through", 8000)
	}
	services[0] = svc("first", 8080)
	services[maxBypassPairs] = svc("past-the-bound", 8080)

	b := serviceBypasses(p, []injectedTemplate{tmpl}, services)
	g.Expect(b.count).To(Equal(1))
	g.Expect(b.named).To(ConsistOf(ContainSubstring("Service first port 80 targets 8080")))
}
