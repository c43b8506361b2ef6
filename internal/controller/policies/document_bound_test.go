package policies

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// sidecarLoadBudget is what loading the largest document the controller writes may allocate
// in a sidecar: its default memory limit is 64Mi and it peaks at about 40 MiB under load
// (docs/reference/sidecar.md, results/sidecarcost.md), which leaves 24 MiB; 16 of them for a reload keep 8 of
// headroom.
const sidecarLoadBudget = 16 << 20

// documentShape is one policy of a given shape: the shapes span what costs the sidecar most per
// byte of document (many small fields) to what costs it least (long strings).
func documentShape(shape string, i int) policydoc.Policy {
	p := policydoc.Policy{
		Name: fmt.Sprintf("p-%06d", i), Generation: 1, FailureMode: "LocalFallback",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
	}
	rules := 32
	if shape == "typical" {
		rules = 1
	}
	for r := range rules {
		rule := policydoc.Rule{
			Name: fmt.Sprintf("r%d", r), Algorithm: "SlidingWindowCounter", Requests: 100, WindowMS: 60000, Mode: "Enforce",
			Key: []policydoc.KeyPart{{Header: "x-api-key"}},
		}
		switch shape {
		case "typical":
			rule.Match = &policydoc.Match{PathPrefix: "/api/", Methods: []string{"POST"}}
		case "minimal rules":
			rule.Key = []policydoc.KeyPart{{Attribute: "Path"}}
		case "every part":
			rule.Key = nil
			for k := range 8 {
				rule.Key = append(rule.Key, policydoc.KeyPart{Header: fmt.Sprintf("h%d", k)})
			}
			rule.Match = &policydoc.Match{Methods: []string{"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}}
			for h := range 16 {
				rule.Match.Headers = append(rule.Match.Headers, policydoc.HeaderMatch{Name: fmt.Sprintf("m%d", h)})
			}
		case "long strings":
			v := strings.Repeat("v", 4096)
			rule.Match = &policydoc.Match{PathPrefix: "/" + strings.Repeat("a", 1023), Headers: []policydoc.HeaderMatch{{Name: "x", Value: &v}}}
		}
		p.Rules = append(p.Rules, rule)
	}
	return p
}

// largestDocument is the largest document of policies of one shape that the controller writes.
func largestDocument(t *testing.T, shape string) (int, []byte) {
	t.Helper()
	scripts := map[string]string{"SlidingWindowCounter": strings.Repeat("a", 40)}
	build := func(n int) []byte {
		ps := make([]policydoc.Policy, n)
		for i := range ps {
			ps[i] = documentShape(shape, i)
		}
		_, data, err := policydoc.Build("ns", ps, scripts)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	// From the estimate one policy's size gives, down while too large, up while one more fits.
	one, two := len(build(1)), len(build(2))
	n := max((policydoc.MaxDocumentBytes-one)/(two-one)+1, 1)
	data := build(n)
	for n > 1 && len(data) > policydoc.MaxDocumentBytes {
		n--
		data = build(n)
	}
	for {
		next := build(n + 1)
		if len(next) > policydoc.MaxDocumentBytes {
			return n, data
		}
		n, data = n+1, next
	}
}

// Issue 18: the controller wrote what its own sidecars cannot load (gzip let 118 MiB of JSON
// into a ConfigMap; a 400-policy document needed a 43 MiB heap in a sidecar limited to 64Mi).
// The largest document written, of any shape, loads within the sidecar's budget: measured as
// what a load allocates in all (read, parse, hash check, rule set, metrics), a bound on its
// peak heap growth.
func TestSidecarLoadsTheLargestDocumentWithinItsBudget(t *testing.T) {
	for _, shape := range []string{"typical", "minimal rules", "every part", "long strings"} {
		t.Run(shape, func(t *testing.T) {
			g := NewWithT(t)
			n, data := largestDocument(t, shape)
			g.Expect(data).NotTo(BeEmpty(), "one policy of this shape fits")
			dir := t.TempDir()
			g.Expect(os.WriteFile(filepath.Join(dir, policydoc.DataKey), data, 0o600)).To(Succeed())
			// Every policy selects the pod: the worst case, each one compiled into the set.
			labels := filepath.Join(dir, "labels")
			g.Expect(os.WriteFile(labels, []byte(`app="web"`+"\n"), 0o600)).To(Succeed())
			store := &ruleset.Store{}
			m := metrics.New(func() limiter.Stats { return limiter.Stats{} }, store)
			loader := &ruleset.Loader{
				Dir: dir, LabelsFile: labels, Builder: ruleset.NewBuilder(""), Store: store,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), OnLoad: m.ConfigLoaded,
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			g.Expect(loader.Load()).To(Succeed())
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d policies, %d bytes: the load allocates %.1f MiB (%.1f x the document)", n, len(data),
				float64(alloc)/(1<<20), float64(alloc)/float64(len(data)))
			g.Expect(store.Current().Policies).To(HaveLen(n))
			g.Expect(alloc).To(BeNumerically("<=", sidecarLoadBudget))
		})
	}
}

// A document over what the sidecar loads is not written, whatever it compresses to, and the
// error names the policies that do not fit: the newest, so that adding one never pushes out
// those already enforced.
func TestEncodeDocumentRefusesWhatTheSidecarCannotLoad(t *testing.T) {
	g := NewWithT(t)
	const n = 700 // of about 1.2 KB each: over 768 KiB
	var ps []sized
	var compiled []policydoc.Policy
	for i := range n {
		// Names run against age: the newest have the smallest names, so the order kept is
		// the age's, not the document's.
		p := compileAll(t, testPolicy(fmt.Sprintf("team-%04d", n-i), int64(100+i)))[0]
		ps = append(ps, sized{policy: p, order: fmt.Sprintf("2026-01-01T00:00:00Z/%06d", i)})
		compiled = append(compiled, p)
	}
	doc, data, err := policydoc.Build("shop", compiled, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(data)).To(BeNumerically(">", policydoc.MaxDocumentBytes))
	g.Expect(len(data)).To(BeNumerically("<", MaxConfigMapBytes), "it would fit a ConfigMap")
	_, err = encodeDocument("shop", doc, data, MaxConfigMapBytes, nil, ps...)
	var te *tenantError
	g.Expect(errors.As(err, &te)).To(BeTrue(), "%v", err)
	g.Expect(te.reason).To(Equal(v1alpha1.ReasonDocumentTooLarge))
	g.Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("compile to %d bytes, over the %d bytes a sidecar loads within its default memory limit", len(data), policydoc.MaxDocumentBytes)))

	// The first policy named is where the oldest stop fitting; the rest are counted.
	_, names, ok := strings.Cut(err.Error(), "these policies do not fit (the oldest are kept first): ")
	g.Expect(ok).To(BeTrue(), err.Error())
	first, _, _ := strings.Cut(names, ", ")
	k := -1
	for i := range ps {
		if ps[i].policy.Name == first {
			k = i
		}
	}
	g.Expect(k).To(BeNumerically(">", 0), "the first policy that does not fit, %q, is one of them", first)
	_, fit, _ := policydoc.Build("shop", compiled[:k], nil)
	_, over, _ := policydoc.Build("shop", compiled[:k+1], nil)
	g.Expect(len(fit)).To(BeNumerically("<=", policydoc.MaxDocumentBytes))
	g.Expect(len(over)).To(BeNumerically(">", policydoc.MaxDocumentBytes))
	g.Expect(names).To(ContainSubstring(fmt.Sprintf("and %d more.", n-k-10)))
	t.Logf("typical policies per namespace: %d (%d bytes each)", k, len(data)/n)
}

// What the controller reads back of a tenant's ConfigMap (after a restart, for an invalid
// update) is bounded before it is allocated: a gzip bomb stops at policydoc.MaxDocumentBytes,
// a larger plain document is refused as it is, and anything the controller did not write is
// not parsed (previousPolicies checks policydoc.Vouched first).
func TestDocumentOfBoundsWhatItReads(t *testing.T) {
	g := NewWithT(t)
	bomb := gzipDocument(t, []byte(`{"version":1,"namespace":"x","hash":"","scripts":{},"policies":[`+strings.Repeat("{},", 16<<20)+"{}]}"))
	g.Expect(len(bomb)).To(BeNumerically("<", 64<<10), "a small ConfigMap")
	cm := &corev1.ConfigMap{BinaryData: map[string][]byte{policydoc.GzipDataKey: bomb}}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := documentOf(cm)
	runtime.ReadMemStats(&after)
	g.Expect(err).To(MatchError(ContainSubstring("exceeds")))
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte gzip bomb of 48 MiB: %.1f MiB allocated reading it", len(bomb), float64(alloc)/(1<<20))
	g.Expect(alloc).To(BeNumerically("<", 4*policydoc.MaxDocumentBytes))

	plain := &corev1.ConfigMap{Data: map[string]string{policydoc.DataKey: strings.Repeat(" ", policydoc.MaxDocumentBytes+1)}}
	_, err = documentOf(plain)
	g.Expect(err).To(MatchError(ContainSubstring("over the")))

	ps := compileAll(t, testPolicy("a", 1))
	doc, data, err := policydoc.Build("shop", ps, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(policydoc.Vouched(data, doc.Hash)).To(BeTrue())
	g.Expect(policydoc.Vouched([]byte(plain.Data[policydoc.DataKey]), doc.Hash)).To(BeFalse())
}

func gzipDocument(t *testing.T, data []byte) []byte {
	t.Helper()
	gz, err := compress(data)
	if err != nil {
		t.Fatal(err)
	}
	return gz
}

// Oldest first, each policy is kept while the document fits: one too large does not keep the
// younger ones out, and the sizes are those of the document that would be written.
func TestNotFittingKeepsTheOldestThatFit(t *testing.T) {
	g := NewWithT(t)
	big := testPolicy("b-big", 2)
	big.Spec.Rules[0].Match.PathPrefix = "/" + strings.Repeat("x", 1000)
	c := compileAll(t, testPolicy("c-old", 1), big, testPolicy("a-young", 3))
	ps := []sized{{policy: c[0], order: "1"}, {policy: c[1], order: "2"}, {policy: c[2], order: "3"}}
	_, both, err := policydoc.Build("shop", []policydoc.Policy{c[0], c[2]}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	doc, _, err := policydoc.Build("shop", c, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(notFitting("shop", doc, ps, len(both))).To(Equal([]string{"b-big"}))
	g.Expect(notFitting("shop", doc, ps, len(both)-1)).To(Equal([]string{"b-big", "a-young"}))
}
