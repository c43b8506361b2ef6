package sidecar_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/docgen"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

func referencePage(t *testing.T, name string) string {
	t.Helper()
	md, err := os.ReadFile(filepath.Join("..", "..", docgen.Dir, name))
	if err != nil {
		t.Fatalf("reading %s (run make docs): %v", name, err)
	}
	return string(md)
}

// The built binary's -help lists exactly the flags of the reference's Sidecar section.
func TestHelpMatchesTheFlagsReference(t *testing.T) {
	g := NewWithT(t)
	cmd := exec.Command(binary, "-help")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// The sidecar answers -help with its usage and exit status 2, like any flag it stops at.
	var exit *exec.ExitError
	g.Expect(err == nil || errors.As(err, &exit)).To(BeTrue(), "%v\n%s", err, out.String())
	var help []string
	for _, n := range docgen.HelpFlags(out.String()) {
		help = append(help, "--"+n)
	}
	want := docgen.TableNames(referencePage(t, "flags.md"), "Sidecar")
	g.Expect(help).To(HaveLen(len(want)))
	g.Expect(help).To(ConsistOf(want), "flags.md is out of date: run make docs")
}

// Every metric a running sidecar serves, after a load and decisions, is in the reference.
func TestLiveMetricsAreInTheReference(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 3, time.Minute, "x-key", "Open"))
	up := newUpstream(t)
	s := start(t, "pod-metrics", e, shared.URL(), up.addr(), true)
	g.Expect(admittedOf(t, s, "k1", 5)).To(Equal(3))
	resp, err := http.Get(s.admin + "/metrics")
	g.Expect(err).NotTo(HaveOccurred())
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	g.Expect(err).NotTo(HaveOccurred())
	live := docgen.ExpositionNames(string(body))
	g.Expect(live).To(ContainElements("redline_sidecar_decisions_total", "redline_sidecar_redis_pool_max_connections", "go_goroutines"))
	g.Expect(docgen.Undocumented(referencePage(t, "metrics.md"), live, "Sidecar", "Sidecar: libraries")).To(BeEmpty(), "metrics.md is out of date: run make docs")
}
