package podinject

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// maxClientCABytes bounds the client CA file read at every change of it.
const maxClientCABytes = 1 << 20

// clientVerifier makes the webhook server answer only clients that present a certificate
// signed by the CA in file (for client authentication), and, with names, one whose common
// name or a DNS name is among them: the API server, where it is configured to present a
// client certificate to admission webhooks (an AdmissionConfiguration's kubeconfig). The
// file is read again when it changes, so a rotated CA mounted from a ConfigMap or Secret is
// taken without a restart.
type clientVerifier struct {
	file  string
	names []string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	pool    *x509.CertPool
}

func newClientVerifier(file string, names []string) (*clientVerifier, error) {
	v := &clientVerifier{file: file, names: names}
	if _, err := v.roots(); err != nil {
		return nil, err
	}
	return v, nil
}

// apply sets c to ask every client for a certificate and verify it (a handshake without one
// fails, before any request is read).
func (v *clientVerifier) apply(c *tls.Config) {
	c.ClientAuth = tls.RequireAnyClientCert
	c.VerifyPeerCertificate = v.verify
}

// roots is the CA pool of the file as it is now.
func (v *clientVerifier) roots() (*x509.CertPool, error) {
	st, err := os.Stat(v.file)
	if err != nil {
		return nil, fmt.Errorf("reading the webhook's client CA: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pool != nil && st.ModTime().Equal(v.modTime) && st.Size() == v.size {
		return v.pool, nil
	}
	if st.Size() > maxClientCABytes {
		return nil, fmt.Errorf("the webhook's client CA %s is %d bytes, more than %d", v.file, st.Size(), maxClientCABytes)
	}
	pem, err := os.ReadFile(v.file)
	if err != nil {
		return nil, fmt.Errorf("reading the webhook's client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the webhook's client CA %s holds no PEM certificate", v.file)
	}
	v.pool, v.modTime, v.size = pool, st.ModTime(), st.Size()
	return pool, nil
}

// verify is tls.Config.VerifyPeerCertificate.
func (v *clientVerifier) verify(raw [][]byte, _ [][]*x509.Certificate) error {
	if len(raw) == 0 {
		return errors.New("the webhook answers only clients with a certificate")
	}
	certs := make([]*x509.Certificate, 0, len(raw))
	for _, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return fmt.Errorf("parsing the client certificate: %w", err)
		}
		certs = append(certs, c)
	}
	roots, err := v.roots()
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("verifying the client certificate: %w", err)
	}
	if len(v.names) > 0 && !slices.Contains(v.names, leaf.Subject.CommonName) &&
		!slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(v.names, n) }) {
		return fmt.Errorf("the client certificate of %q is not one of --webhook-client-names", leaf.Subject.CommonName)
	}
	return nil
}
