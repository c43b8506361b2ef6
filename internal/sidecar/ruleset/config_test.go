package ruleset_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/testutil/kubeletdir"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

func TestParseLabels(t *testing.T) {
	g := NewWithT(t)
	got, err := ruleset.ParseLabels([]byte("app=\"checkout\"\npod-template-hash=\"7d4f\"\n\nnote=\"a \\\"quoted\\\" = value\\n\"\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(map[string]string{"app": "checkout", "pod-template-hash": "7d4f", "note": "a \"quoted\" = value\n"}))

	for _, bad := range []string{"app", "app=checkout", "=\"x\"", "app=\"open"} {
		_, err := ruleset.ParseLabels([]byte(bad))
		g.Expect(err).To(HaveOccurred(), bad)
	}
}

type loaderFixture struct {
	dir, labels string
	store       *ruleset.Store
	loader      *ruleset.Loader
	errors      atomic.Int64
	logs        *bytes.Buffer
}

func newLoader(t *testing.T) *loaderFixture {
	t.Helper()
	f := &loaderFixture{dir: filepath.Join(t.TempDir(), "policies"), labels: filepath.Join(t.TempDir(), "podinfo", "labels"), store: &ruleset.Store{}, logs: &bytes.Buffer{}}
	f.loader = &ruleset.Loader{
		Dir: f.dir, LabelsFile: f.labels, Builder: ruleset.NewBuilder(""), Store: f.store,
		Log:     slog.New(slog.NewJSONHandler(f.logs, nil)),
		OnError: func(error) { f.errors.Add(1) },
		Resync:  time.Hour,
	}
	if err := kubeletdir.Write(filepath.Dir(f.labels), map[string][]byte{"labels": []byte(`app="checkout"` + "\n")}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *loaderFixture) write(t *testing.T, data []byte) {
	t.Helper()
	if err := kubeletdir.Write(f.dir, map[string][]byte{policydoc.DataKey: data}); err != nil {
		t.Fatal(err)
	}
}

func requestsInForce(s *ruleset.Store) int64 {
	if set := s.Current(); set != nil && len(set.Rules) > 0 {
		return set.Rules[0].Limit.Requests
	}
	return 0
}

// A namespace without policies has no ConfigMap: the sidecar is ready and enforces nothing. A
// document that is there but invalid, with nothing good before it, leaves it not ready.
func TestLoaderWithoutDocumentEnforcesNothing(t *testing.T) {
	g := NewWithT(t)
	f := newLoader(t)
	g.Expect(os.MkdirAll(f.dir, 0o755)).To(Succeed())
	g.Expect(f.loader.Load()).To(Succeed())
	ready, _ := f.store.Ready()
	g.Expect(ready).To(BeTrue())
	g.Expect(f.store.Current().Rules).To(BeEmpty())
}

func TestLoaderNotReadyWithInvalidFirstDocument(t *testing.T) {
	g := NewWithT(t)
	f := newLoader(t)
	f.write(t, []byte("{not json"))
	g.Expect(f.loader.Load()).To(HaveOccurred())
	ready, why := f.store.Ready()
	g.Expect(ready).To(BeFalse())
	g.Expect(why).To(ContainSubstring("parsing policies document"))
	g.Expect(f.errors.Load()).To(Equal(int64(1)))
}

// The ConfigMap goes with the namespace's last policy: the limits go with it.
func TestLoaderDocumentRemovedDropsLimits(t *testing.T) {
	g := NewWithT(t)
	f := newLoader(t)
	f.write(t, sidecartest.Document("shop", "p", "r", "checkout", 10, time.Minute, "x-key", "Open"))
	g.Expect(f.loader.Load()).To(Succeed())
	g.Expect(f.store.Current().Rules).To(HaveLen(1))
	g.Expect(os.RemoveAll(f.dir)).To(Succeed())
	g.Expect(os.MkdirAll(f.dir, 0o755)).To(Succeed())
	g.Expect(f.loader.Load()).To(Succeed())
	g.Expect(f.store.Current().Rules).To(BeEmpty())
	ready, _ := f.store.Ready()
	g.Expect(ready).To(BeTrue())
}

// Kubelet-style swaps are picked up by the watcher; a corrupt document is refused once and the
// last good set stays in force; labels changes re-select policies.
func TestLoaderWatchesKubeletSwaps(t *testing.T) {
	g := NewWithT(t)
	f := newLoader(t)
	f.write(t, sidecartest.Document("shop", "p", "r", "checkout", 10, time.Minute, "x-key", "Open"))
	g.Expect(f.loader.Load()).To(Succeed())
	g.Expect(f.store.Ready()).To(BeTrue())
	g.Expect(requestsInForce(f.store)).To(Equal(int64(10)))
	replicas := f.store.Current().Policies[0].Replicas
	replicas.Store(3)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.loader.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(50 * time.Millisecond) // let the watcher start; the assertions below poll

	f.write(t, sidecartest.Document("shop", "p", "r", "checkout", 20, time.Minute, "x-key", "Open"))
	g.Eventually(func() int64 { return requestsInForce(f.store) }).WithTimeout(5 * time.Second).Should(Equal(int64(20)))
	g.Expect(f.store.Current().Policies[0].Replicas).To(BeIdenticalTo(replicas), "per-policy state survives reloads")

	f.write(t, []byte(`{"version": 1, "hash": "bogus"}`))
	g.Eventually(f.errors.Load).WithTimeout(5 * time.Second).Should(Equal(int64(1)))
	g.Consistently(f.errors.Load).WithTimeout(300*time.Millisecond).Should(Equal(int64(1)), "a refused document counts once")
	g.Expect(requestsInForce(f.store)).To(Equal(int64(20)))
	g.Expect(f.logs.String()).To(ContainSubstring("keeping the set in force"))

	// The pod's labels change: the policy no longer selects it.
	f.write(t, sidecartest.Document("shop", "p", "r", "checkout", 30, time.Minute, "x-key", "Open"))
	g.Eventually(func() int64 { return requestsInForce(f.store) }).WithTimeout(5 * time.Second).Should(Equal(int64(30)))
	g.Expect(kubeletdir.Write(filepath.Dir(f.labels), map[string][]byte{"labels": []byte(`app="other"` + "\n")})).To(Succeed())
	g.Eventually(func() int { return len(f.store.Current().Policies) }).WithTimeout(5 * time.Second).Should(Equal(0))
}

// A namespace whose document only fits compressed gets it as binaryData policies.json.gz; the
// loader reads that form, and switches back when the plain form returns. A compressed file
// that expands past policydoc.MaxDocumentBytes is refused and the set in force kept.
func TestLoaderReadsTheGzipForm(t *testing.T) {
	g := NewWithT(t)
	f := newLoader(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(sidecartest.Document("shop", "p", "r", "checkout", 42, time.Minute, "x-key", "Open"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(zw.Close()).To(Succeed())
	g.Expect(kubeletdir.Write(f.dir, map[string][]byte{policydoc.GzipDataKey: gz.Bytes()})).To(Succeed())
	g.Expect(f.loader.Load()).To(Succeed())
	g.Expect(requestsInForce(f.store)).To(Equal(int64(42)))

	var bomb bytes.Buffer
	zw = gzip.NewWriter(&bomb)
	_, err = zw.Write(make([]byte, policydoc.MaxDocumentBytes+1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(zw.Close()).To(Succeed())
	g.Expect(kubeletdir.Write(f.dir, map[string][]byte{policydoc.GzipDataKey: bomb.Bytes()})).To(Succeed())
	g.Expect(f.loader.Load()).To(MatchError(ContainSubstring("exceeds")))
	g.Expect(requestsInForce(f.store)).To(Equal(int64(42)))

	f.write(t, sidecartest.Document("shop", "p", "r", "checkout", 7, time.Minute, "x-key", "Open"))
	g.Expect(f.loader.Load()).To(Succeed())
	g.Expect(requestsInForce(f.store)).To(Equal(int64(7)))
}
