package sidecar_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Through the built sidecar, on its own Redis connection and scripts: dry runs on /v1/check
// spend nothing of a limit the proxy then admits in full, and once the proxy has spent it the
// dry run says so, naming the rule, as a real check does.
func TestDryRunThroughTheSidecar(t *testing.T) {
	g := NewWithT(t)
	const window = 24 * time.Hour
	if left := time.Until(time.Now().Truncate(window).Add(window)); left < 3*time.Minute {
		t.Logf("waiting %s for the next window", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
	up := &upstream{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "served\n")
	}))}
	t.Cleanup(up.Close)
	e := newEnv(t, "web")
	rule := func(name, alg string, requests int64) policydoc.Rule {
		return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: alg, Requests: requests,
			WindowMS: window.Milliseconds(), Mode: "Enforce"}
	}
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "web", rule("per-key", "FixedWindow", 3), rule("log", "SlidingWindowLog", 5)))
	s := start(t, "dryrun", e, shared.URL(), up.addr(), true)

	check := func(body string) checkapi.Response {
		resp, err := http.Post(s.check+"/v1/check", "application/json", strings.NewReader(body))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		raw, _ := io.ReadAll(resp.Body)
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK), string(raw))
		var out checkapi.Response
		g.Expect(json.Unmarshal(raw, &out)).To(Succeed())
		return out
	}
	const dry = `{"method":"GET","path":"/orders","headers":{"X-API-Key":"k1"},"dryRun":true}`
	for range 20 {
		d := check(dry)
		g.Expect(d.Allowed).To(BeTrue())
		g.Expect(d.Results).To(HaveLen(2))
		g.Expect(d.Results[0].Remaining).To(Equal(int64(2)))
		g.Expect(d.Results[1].Remaining).To(Equal(int64(4)))
	}
	admitted := 0
	for range 5 {
		req, err := http.NewRequest(http.MethodGet, s.proxy+"/orders", nil)
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("X-API-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(3), "20 dry runs spent nothing")

	d := check(dry)
	g.Expect(d.Allowed).To(BeFalse())
	g.Expect(d.Policy + "/" + d.Rule).To(Equal("p/per-key"))
	g.Expect(d.RetryAfterSeconds).To(BeNumerically(">", 0))
	g.Expect(d.Results[1].Remaining).To(Equal(int64(1)), "the log counts the 3 admitted, none of the refused: 5 - 3 - this one")
	real := check(strings.Replace(dry, `,"dryRun":true`, "", 1))
	g.Expect(real.Allowed).To(BeFalse())
	g.Expect(real.Policy + "/" + real.Rule).To(Equal("p/per-key"))
	g.Expect(real.Results[1].Remaining).To(Equal(d.Results[1].Remaining))
}
