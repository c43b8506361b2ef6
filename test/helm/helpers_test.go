package helm

import (
	"encoding/json"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// mustSelector is the namespace selector of the first webhook of hook.
func mustSelector(g Gomega, hook *unstructured.Unstructured) labels.Selector {
	hooks, _, _ := unstructured.NestedSlice(hook.Object, "webhooks")
	g.Expect(hooks).NotTo(BeEmpty())
	raw, err := json.Marshal(hooks[0].(map[string]any)["namespaceSelector"])
	g.Expect(err).NotTo(HaveOccurred())
	var ls metav1.LabelSelector
	g.Expect(json.Unmarshal(raw, &ls)).To(Succeed())
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	g.Expect(err).NotTo(HaveOccurred())
	return sel
}

// convert turns an unstructured object into a typed one.
func convert[T any](g Gomega, o *unstructured.Unstructured) *T {
	g.Expect(o).NotTo(BeNil())
	out := new(T)
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out)).To(Succeed())
	return out
}
