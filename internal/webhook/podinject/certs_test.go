package podinject

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestGenerateBundleVerifiesForServiceNames(t *testing.T) {
	g := NewWithT(t)
	now := time.Now()
	names := ServiceDNSNames("redline-webhook-service", "redline-system")
	b, err := GenerateBundle(names, now)
	g.Expect(err).NotTo(HaveOccurred())

	_, err = tls.X509KeyPair(b.TLSCert, b.TLSKey)
	g.Expect(err).NotTo(HaveOccurred(), "serving certificate and key must pair")
	ca, err := parseCert(b.CACert)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ca.IsCA).To(BeTrue())
	leaf, err := parseCert(b.TLSCert)
	g.Expect(err).NotTo(HaveOccurred())

	roots := x509.NewCertPool()
	roots.AddCert(ca)
	g.Expect(names).To(ContainElement("redline-webhook-service.redline-system.svc"))
	for _, name := range names {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now})
		g.Expect(err).NotTo(HaveOccurred(), "verifying for %s", name)
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "other.redline-system.svc", Roots: roots, CurrentTime: now})
	g.Expect(err).To(HaveOccurred(), "a name not asked for must not verify")

	other, err := GenerateBundle(names, now)
	g.Expect(err).NotTo(HaveOccurred())
	foreign := x509.NewCertPool()
	foreign.AppendCertsFromPEM(other.CACert)
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: names[0], Roots: foreign, CurrentTime: now})
	g.Expect(err).To(HaveOccurred(), "another CA must not verify the certificate")
}

func TestCheckBundle(t *testing.T) {
	now := time.Now()
	names := ServiceDNSNames("svc", "ns")
	fresh, err := GenerateBundle(names, now)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := GenerateBundle(names, now)
	if err != nil {
		t.Fatal(err)
	}
	mixed := *fresh
	mixed.TLSCert, mixed.TLSKey = otherCA.TLSCert, otherCA.TLSKey
	broken := *fresh
	broken.TLSKey = otherCA.TLSKey

	tests := []struct {
		name                     string
		bundle                   *CertBundle
		names                    []string
		at                       time.Time
		wantCA, wantServingRenew bool
	}{
		{"fresh bundle is kept", fresh, names, now, false, false},
		{"serving certificate near its end is renewed", fresh, names, now.Add(servingLifetime - renewBefore/2), false, true},
		{"CA near its end renews everything", fresh, names, now.Add(caLifetime - renewBefore/2), true, true},
		{"new service name renews the serving certificate", fresh, ServiceDNSNames("renamed", "ns"), now, false, true},
		{"certificate of another CA is renewed", &mixed, names, now, false, true},
		{"mismatched key is renewed", &broken, names, now, false, true},
		{"empty secret renews everything", &CertBundle{}, names, now, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ca, serving := checkBundle(tt.bundle, tt.names, tt.at)
			g.Expect(ca).To(Equal(tt.wantCA))
			g.Expect(serving).To(Equal(tt.wantServingRenew))
		})
	}
}

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
