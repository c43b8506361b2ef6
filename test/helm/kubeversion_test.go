package helm

import (
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/chartutil"
)

// TestKubeVersionRefusesBefore130 renders the chart for a 1.29 cluster and expects Helm's
// refusal: the chart's ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and the
// webhook's matchConditions are GA only in 1.30, so a 1.29 install would pass rendering and fail
// on apply, half installed. 1.30.0 itself renders.
func TestKubeVersionRefusesBefore130(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version, minor string
		refused        bool
	}{
		{"v1.29.15", "29", true},
		{"v1.30.0", "30", false},
		{"v1.37.2", "37", false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			g := NewWithT(t)
			kv := &chartutil.KubeVersion{Version: tc.version, Major: "1", Minor: tc.minor}
			manifest, _, err := RenderAt(ch, map[string]any{}, kv)
			if tc.refused {
				g.Expect(err).To(MatchError(ContainSubstring("chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes " + tc.version)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(manifest).To(ContainSubstring("kind: ValidatingAdmissionPolicy"))
		})
	}
}
