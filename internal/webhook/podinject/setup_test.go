package podinject

import (
	"testing"

	. "github.com/onsi/gomega"
)

func TestServerVersion(t *testing.T) {
	tests := []struct {
		git, major, minor string
		native            bool
	}{
		{"v1.37.2", "1", "37", true},
		{"v1.29.0", "1", "29", true},
		{"v1.28.9", "1", "28", false},
		{"v1.30.2-eks-1de2ab1", "1", "30+", true},
		{"v1.28.15-gke.100", "1", "28+", false},
		{"", "1", "29+", true},
	}
	for _, tt := range tests {
		t.Run(tt.git+"/"+tt.minor, func(t *testing.T) {
			g := NewWithT(t)
			v, err := serverVersion(tt.git, tt.major, tt.minor)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(v.AtLeast(nativeSidecarsSince)).To(Equal(tt.native))
		})
	}
}
