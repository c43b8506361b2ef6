package podinject

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

type panicMutator struct{}

func (panicMutator) name() string                         { return "panic" }
func (panicMutator) mutate(*corev1.Pod, *injection) error { panic("boom") }

type failMutator struct{}

func (failMutator) name() string                         { return "fail" }
func (failMutator) mutate(*corev1.Pod, *injection) error { return errors.New("no room") }

func podRequest(t *testing.T, op admissionv1.Operation, raw []byte) admission.Request {
	t.Helper()
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Operation: op, Namespace: "shop",
		Kind:   metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Object: runtime.RawExtension{Raw: raw},
	}}
}

func optedInPod(t *testing.T) []byte {
	t.Helper()
	raw, err := json.Marshal(&corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop", Annotations: map[string]string{contract.AnnotationInject: "true", contract.AnnotationUpstreamPort: "8080"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestHandlerNeverRefuses(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.SidecarImage = "sidecar:test"
	handler := func(ms ...mutator) *Handler {
		in := NewInjector(cfg, true)
		if ms != nil {
			in.mutators = ms
		}
		return NewHandler(in, scheme, log.Log)
	}

	tests := []struct {
		name        string
		h           *Handler
		req         admission.Request
		wantPatch   bool
		wantWarning string
	}{
		{"opted-in pod is patched", handler(), podRequest(t, admissionv1.Create, optedInPod(t)), true, ""},
		{"update is not touched", handler(), podRequest(t, admissionv1.Update, optedInPod(t)), false, ""},
		{"undecodable pod is admitted", handler(), podRequest(t, admissionv1.Create, []byte("{not json")), false, "could not be decoded"},
		{"mutator failure is admitted", handler(failMutator{}), podRequest(t, admissionv1.Create, optedInPod(t)), false, "applying the fail mutator: no room"},
		{"panic is admitted", handler(panicMutator{}), podRequest(t, admissionv1.Create, optedInPod(t)), false, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			resp := tt.h.Handle(context.Background(), tt.req)
			g.Expect(resp.Allowed).To(BeTrue())
			if tt.wantPatch {
				g.Expect(resp.Patches).NotTo(BeEmpty())
			} else {
				g.Expect(resp.Patches).To(BeEmpty())
			}
			if tt.wantWarning == "" {
				g.Expect(resp.Warnings).To(BeEmpty())
			} else {
				g.Expect(resp.Warnings).To(ConsistOf(And(HavePrefix(WarningPrefix), ContainSubstring(tt.wantWarning))))
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	g := NewWithT(t)
	cfg := DefaultConfig()
	g.Expect(cfg.Validate()).To(Succeed())
	cfg.NativeSidecars = "maybe"
	cfg.CertMode = "vault"
	cfg.Port = 0
	err := cfg.Validate()
	g.Expect(err).To(MatchError(ContainSubstring("--native-sidecars")))
	g.Expect(err).To(MatchError(ContainSubstring("--webhook-cert-mode")))
	g.Expect(err).To(MatchError(ContainSubstring("--webhook-port")))
}
