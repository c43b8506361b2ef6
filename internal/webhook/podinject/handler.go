package podinject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// WarningPrefix starts every admission warning of the injector, so that a person reading
// kubectl's output knows where it comes from.
const WarningPrefix = "redline: sidecar not injected: "

// Handler is the admission handler for pods. Whatever happens, it admits the pod: the
// injection is an addition, never a gate.
type Handler struct {
	injector *Injector
	decoder  admission.Decoder
	log      logr.Logger
	// namespaceOptedIn: this handler serves NamespacePath, called for the pods of namespaces
	// labelled NamespaceLabelInjection.
	namespaceOptedIn bool
}

// NewHandler returns a Handler that injects with injector the pods that opted in.
func NewHandler(injector *Injector, scheme *runtime.Scheme, log logr.Logger) *Handler {
	return &Handler{injector: injector, decoder: admission.NewDecoder(scheme), log: log}
}

// NewNamespaceHandler returns a Handler for the pods of namespaces that opted in: it injects
// every pod that does not opt out.
func NewNamespaceHandler(injector *Injector, scheme *runtime.Scheme, log logr.Logger) *Handler {
	h := NewHandler(injector, scheme, log)
	h.namespaceOptedIn = true
	return h
}

var _ admission.Handler = (*Handler)(nil)

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) (resp admission.Response) {
	log := h.log.WithValues("namespace", req.Namespace, "name", req.Name, "uid", req.UID)
	defer func() {
		// controller-runtime would turn a panic into an error response, which the API server
		// treats as a rejection whatever the failurePolicy says.
		if r := recover(); r != nil {
			log.Error(fmt.Errorf("panic: %v", r), "injecting pod")
			resp = admission.Allowed("").WithWarnings(WarningPrefix + "internal error (see the redline manager's log)")
		}
	}()

	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := h.decoder.Decode(req, pod); err != nil {
		log.Error(err, "decoding pod")
		return admission.Allowed("").WithWarnings(WarningPrefix + "the pod could not be decoded")
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace // the workload lookups need it
	}
	out, warns, err := h.injector.inject(ctx, pod, h.namespaceOptedIn)
	switch {
	case errors.Is(err, ErrSkipped):
		return admission.Allowed("")
	case err != nil:
		log.Info("pod admitted without sidecar", "generateName", pod.GenerateName, "reason", err.Error())
		return admission.Allowed("").WithWarnings(WarningPrefix + err.Error())
	}
	raw, err := json.Marshal(out)
	if err != nil {
		log.Error(err, "encoding injected pod")
		return admission.Allowed("").WithWarnings(WarningPrefix + "the injected pod could not be encoded")
	}
	resp = admission.PatchResponseFromRaw(req.Object.Raw, raw)
	if !resp.Allowed {
		log.Error(errors.New(resp.Result.Message), "computing patch")
		return admission.Allowed("").WithWarnings(WarningPrefix + "the patch could not be computed")
	}
	log.V(1).Info("sidecar injected", "generateName", pod.GenerateName, "native", h.injector.Native(), "patches", len(resp.Patches))
	return resp.WithWarnings(warns...)
}
