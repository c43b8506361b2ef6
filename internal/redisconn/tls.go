package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLS versions TLSOptions.MinVersion takes.
const (
	TLSVersion12 = "1.2"
	TLSVersion13 = "1.3"
)

// maxTLSFileBytes bounds what is read of a CA bundle, a certificate chain or a key: a
// sidecar's sit in a Secret of its namespace, which its tenant can write. A whole system CA
// bundle is about 220 KiB.
const maxTLSFileBytes = 1 << 20

// TLSOptions are the TLS settings of a rediss:// or rediss+sentinel:// URL, beyond what the
// URL says: whom to trust, what to present, which name to verify, which versions to speak.
// They apply to every connection the client opens: the server, every cluster node, every
// sentinel and the master and replicas the sentinels name. The zero value verifies the
// servers against the system's CAs, presents no certificate, verifies each server under the
// host it is dialed at and speaks TLS 1.2 or later.
//
// Files are read when a client is built (a missing or bad file is an error then) and checked
// again at each new connection: when one changed (a mounted Secret rotated: kubelet swaps the
// files), the new content is used from that connection on. A changed file that does not parse
// is reported once (Options.TLSFileError) and the last good content kept, so that a broken
// rotation does not take Redis away from every pod while the certificates in use are still
// valid. Open connections keep the certificates they were made with.
type TLSOptions struct {
	// CAFile is a PEM bundle of the CAs whose certificates the servers' chains must end in
	// (empty: the system's CAs). It replaces the system's CAs, it does not add to them.
	CAFile string
	// CertFile and KeyFile are the client's certificate chain and private key (PEM), sent to a
	// server that asks for one (Redis's tls-auth-clients yes or optional): both or neither.
	CertFile, KeyFile string
	// ServerName is the name every server's certificate must carry (empty: the host each
	// connection dials, as the URL names it, or as a cluster's slot map or the sentinels name
	// a node, usually an IP address). Set it when every node presents a certificate for one
	// name that is not the address it is reached at.
	ServerName string
	// MinVersion is the oldest TLS version accepted: TLSVersion12 (the default, when empty)
	// or TLSVersion13.
	MinVersion string
}

// IsZero says whether t asks for nothing beyond the defaults: the system's CAs, no client
// certificate, the host dialed, TLS 1.2 or later.
func (t TLSOptions) IsZero() bool {
	if t.MinVersion == TLSVersion12 {
		t.MinVersion = ""
	}
	return t == TLSOptions{}
}

// Validate reports what is wrong in t without reading its files.
func (t TLSOptions) Validate() error {
	var errs []error
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs = append(errs, fmt.Errorf("a TLS client certificate needs both its certificate file and its key file (got certificate %q, key %q)", t.CertFile, t.KeyFile))
	}
	if _, err := t.minVersion(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (t TLSOptions) minVersion() (uint16, error) {
	switch t.MinVersion {
	case "", TLSVersion12:
		return tls.VersionTLS12, nil
	case TLSVersion13:
		return tls.VersionTLS13, nil
	default:
		return 0, fmt.Errorf("TLS minimum version %q: want %s or %s", t.MinVersion, TLSVersion12, TLSVersion13)
	}
}

// URLUsesTLS says whether a URL of NewClient's grammar connects over TLS (rediss://,
// rediss+sentinel://), for callers that check their settings before building a client.
func URLUsesTLS(rawURL string) bool {
	scheme, _, _ := strings.Cut(rawURL, "://")
	return scheme == "rediss" || scheme == "rediss+sentinel"
}

// tlsFiles is the TLS configuration of one client, kept current with its files.
type tlsFiles struct {
	opts    TLSOptions
	onError func(error)
	base    *tls.Config // everything but RootCAs; never changed once built

	mu   sync.Mutex
	ca   fileGroup
	cfg  *tls.Config // base with the CAs of ca; replaced, never changed, when they change
	cert fileGroup
	leaf *tls.Certificate
}

// fileGroup is what was last read of files that are loaded together (a certificate and its
// key): their stamps when they loaded, and when they last failed to.
type fileGroup struct {
	paths        []string
	good, broken []stamp
}

// stamp identifies a file's content cheaply: the file (device and inode), its size and
// modification time, or the error its stat gave. kubelet writes a rotated Secret as new files,
// so a rotation always changes the stamp.
type stamp struct {
	fi  os.FileInfo
	err string
}

func (g *fileGroup) stamps() []stamp {
	s := make([]stamp, len(g.paths))
	for i, p := range g.paths {
		s[i] = stampOf(p)
	}
	return s
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{err: err.Error()}
	}
	return stamp{fi: fi}
}

func (a stamp) equal(b stamp) bool {
	if a.fi == nil || b.fi == nil {
		return a.fi == nil && b.fi == nil && a.err == b.err
	}
	return os.SameFile(a.fi, b.fi) && a.fi.Size() == b.fi.Size() && a.fi.ModTime().Equal(b.fi.ModTime())
}

func stampsEqual(a, b []stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].equal(b[i]) {
			return false
		}
	}
	return true
}

// newTLSFiles reads t's files; any problem with them is an error now rather than at the first
// connection.
func newTLSFiles(t TLSOptions, onError func(error)) (*tlsFiles, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	minVersion, _ := t.minVersion()
	f := &tlsFiles{opts: t, onError: onError}
	f.base = &tls.Config{MinVersion: minVersion, ServerName: t.ServerName}
	if t.CertFile != "" {
		f.cert.paths = []string{t.CertFile, t.KeyFile}
		leaf, err := loadFirst(&f.cert, loadKeyPair)
		if err != nil {
			return nil, err
		}
		f.leaf = leaf
		// Asked at each handshake that requests a certificate: the current files, not the
		// ones the client started with.
		f.base.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return f.clientCertificate(), nil
		}
	}
	f.cfg = f.base
	if t.CAFile != "" {
		f.ca.paths = []string{t.CAFile}
		pool, err := loadFirst(&f.ca, loadCAPool)
		if err != nil {
			return nil, err
		}
		f.cfg = f.withCAs(pool)
	}
	return f, nil
}

func (f *tlsFiles) withCAs(pool *x509.CertPool) *tls.Config {
	c := f.base.Clone()
	c.RootCAs = pool
	return c
}

// config is the configuration a new connection uses: the CAs of the CA file as it is now.
func (f *tlsFiles) config() *tls.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opts.CAFile != "" {
		if pool, ok := reload(f, &f.ca, loadCAPool); ok {
			f.cfg = f.withCAs(pool)
		}
	}
	return f.cfg
}

// clientCertificate is the certificate of the files as they are now.
func (f *tlsFiles) clientCertificate() *tls.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	if leaf, ok := reload(f, &f.cert, loadKeyPair); ok {
		f.leaf = leaf
	}
	return f.leaf
}

// reload loads g's files again when their stamps changed since they last loaded or last
// failed to (one stat a file: cheap enough for every new connection); ok says it loaded
// something new. A failure is reported once and the old content kept. f.mu is held.
func reload[T any](f *tlsFiles, g *fileGroup, load func(paths []string) (T, error)) (v T, ok bool) {
	if now := g.stamps(); stampsEqual(now, g.good) || stampsEqual(now, g.broken) {
		return v, false
	}
	v, stamps, err := loadStable(g, load)
	if err != nil {
		g.broken = stamps
		if f.onError != nil {
			f.onError(fmt.Errorf("%w; connections go on with the last good content", err))
		}
		return v, false
	}
	g.good, g.broken = stamps, nil
	return v, true
}

// loadFirst is the first load of g.
func loadFirst[T any](g *fileGroup, load func([]string) (T, error)) (T, error) {
	v, stamps, err := loadStable(g, load)
	if err == nil {
		g.good = stamps
	}
	return v, err
}

// loadStable loads g's files and returns the stamps they had, taken before they were read (a
// file replaced after that has another stamp, and is read again at the next connection). A
// load that fails while the files changed under it (a certificate read before a rotation and
// its key after) is tried again, a few times, before it counts as broken.
func loadStable[T any](g *fileGroup, load func([]string) (T, error)) (v T, stamps []stamp, err error) {
	stamps = g.stamps()
	for range 3 {
		if v, err = load(g.paths); err == nil {
			return v, stamps, nil
		}
		after := g.stamps()
		if stampsEqual(after, stamps) {
			break
		}
		stamps = after
	}
	return v, stamps, err
}

func loadKeyPair(paths []string) (*tls.Certificate, error) {
	certPEM, err := readTLSFile(paths[0], "client certificate")
	if err != nil {
		return nil, err
	}
	keyPEM, err := readTLSFile(paths[1], "client key")
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the redis TLS client certificate %s with key %s: %w", paths[0], paths[1], err)
	}
	return &pair, nil
}

func loadCAPool(paths []string) (*x509.CertPool, error) {
	b, err := readTLSFile(paths[0], "CA bundle")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("loading the redis TLS CA bundle %s: no PEM certificate in it", paths[0])
	}
	return pool, nil
}

// readTLSFile reads one file, at most maxTLSFileBytes of it.
func readTLSFile(path, what string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the redis TLS %s: %w", what, err)
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, maxTLSFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the redis TLS %s %s: %w", what, path, err)
	}
	if len(b) > maxTLSFileBytes {
		return nil, fmt.Errorf("reading the redis TLS %s %s: longer than %d bytes", what, path, maxTLSFileBytes)
	}
	return b, nil
}

// dialer opens TLS connections with the configuration of the moment: go-redis's own dialer
// (its TCP keep-alive, the handshake before the connection is handed over), given the current
// CAs at each dial. A failed handshake says what was wrong with the certificate.
func (f *tlsFiles) dialer(timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: f.config()})(ctx, network, addr)
		if err != nil {
			return nil, f.explain(addr, err)
		}
		return c, nil
	}
}

// explain wraps a dial error with what the TLS settings have to do with it.
func (f *tlsFiles) explain(addr string, err error) error {
	trust := "the system's CAs"
	if f.opts.CAFile != "" {
		trust = "the CA bundle " + f.opts.CAFile
	}
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("TLS to redis %s: the server's certificate is not signed by a CA in %s: %w", addr, trust, err)
	case errors.As(err, &hostname):
		return fmt.Errorf("TLS to redis %s: the server's certificate is not for the name verified (%s; the TLS server name option sets it): %w", addr, f.verifiedName(addr), err)
	case errors.As(err, &invalid):
		return fmt.Errorf("TLS to redis %s: the server's certificate is not valid: %w", addr, err)
	default:
		return fmt.Errorf("dialing redis %s over TLS: %w", addr, err)
	}
}

func (f *tlsFiles) verifiedName(addr string) string {
	if f.opts.ServerName != "" {
		return "the server name " + f.opts.ServerName
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return "the host dialed, " + host
}
