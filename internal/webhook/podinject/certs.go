package podinject

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Lifetimes of the self-signed certificates. The CA lives long because replacing it means a
// window in which the caBundle and the serving certificate disagree; the serving certificate is
// renewed, under the same CA, well before it expires.
const (
	caLifetime      = 10 * 365 * 24 * time.Hour
	servingLifetime = 365 * 24 * time.Hour
	// renewBefore: a certificate this close to its end is replaced.
	renewBefore = 30 * 24 * time.Hour
)

// CertBundle is a CA and a serving certificate signed by it, PEM encoded.
type CertBundle struct {
	CACert, CAKey   []byte
	TLSCert, TLSKey []byte
}

// ServiceDNSNames are the names the API server may use to reach Service name in namespace.
func ServiceDNSNames(name, namespace string) []string {
	return []string{
		name + "." + namespace + ".svc",
		name + "." + namespace + ".svc.cluster.local",
		name + "." + namespace,
		name,
	}
}

// GenerateCA creates a self-signed CA valid from now.
func GenerateCA(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "redline-webhook-ca", Organization: []string{"redline.dev"}},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew between manager and API server
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// GenerateServing creates a serving certificate for dnsNames signed by the given CA.
func GenerateServing(caCertPEM, caKeyPEM []byte, dnsNames []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("generating serving certificate: no DNS names")
	}
	ca, err := tls.X509KeyPair(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("loading CA key pair: %w", err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating serving key: %w", err)
	}
	notAfter := now.Add(servingLifetime)
	if notAfter.After(caCert.NotAfter) {
		notAfter = caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: dnsNames[0], Organization: []string{"redline.dev"}},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing serving certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// GenerateBundle creates a new CA and a serving certificate for dnsNames.
func GenerateBundle(dnsNames []string, now time.Time) (*CertBundle, error) {
	caCert, caKey, err := GenerateCA(now)
	if err != nil {
		return nil, err
	}
	cert, key, err := GenerateServing(caCert, caKey, dnsNames, now)
	if err != nil {
		return nil, err
	}
	return &CertBundle{CACert: caCert, CAKey: caKey, TLSCert: cert, TLSKey: key}, nil
}

// checkBundle says what of b must be replaced at time now for dnsNames: the whole bundle
// (renewCA) or only the serving certificate (renewServing).
func checkBundle(b *CertBundle, dnsNames []string, now time.Time) (renewCA, renewServing bool) {
	ca, err := parseCert(b.CACert)
	if err != nil || now.Add(renewBefore).After(ca.NotAfter) {
		return true, true
	}
	if _, err := tls.X509KeyPair(b.CACert, b.CAKey); err != nil {
		return true, true
	}
	if _, err := tls.X509KeyPair(b.TLSCert, b.TLSKey); err != nil {
		return false, true
	}
	leaf, err := parseCert(b.TLSCert)
	if err != nil || now.Add(renewBefore).After(leaf.NotAfter) {
		return false, true
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, name := range dnsNames {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: now}); err != nil {
			return false, true
		}
	}
	return false, false
}

func parseCert(certPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on supported platforms; a fixed serial still works.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// equalPEM compares PEM bytes, ignoring surrounding whitespace.
func equalPEM(a, b []byte) bool { return bytes.Equal(bytes.TrimSpace(a), bytes.TrimSpace(b)) }
