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

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// The built sidecar with --decision-log=refused writes one JSON line per refusal it keeps,
// naming the key by its hash only, and counts the lines its rate bound keeps out.
func TestDecisionLogOfTheBuiltSidecar(t *testing.T) {
	g := NewWithT(t)
	up := &upstream{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "served\n")
	}))}
	t.Cleanup(up.Close)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "web", policydoc.Rule{Name: "per-key", Key: []policydoc.KeyPart{{Header: "x-api-key"}},
		Algorithm: "FixedWindow", Requests: 3, WindowMS: time.Hour.Milliseconds(), Mode: "Enforce"}))
	s := start(t, "decisions", e, shared.URL(), up.addr(), true, "--decision-log=refused", "--decision-log-rate=2")

	const sent = 12
	refused := 0
	for range sent {
		req, err := http.NewRequest(http.MethodGet, s.proxy+"/orders", nil)
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("X-API-Key", "customer-secret")
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			refused++
		}
	}
	g.Expect(refused).To(Equal(sent - 3))

	want := keyscheme.Hash(keyscheme.Key(e.namespace, "p", "per-key", "customer-secret"))
	var logged int
	for line := range strings.SplitSeq(s.Log(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "decision" {
			continue
		}
		logged++
		g.Expect(m).To(And(HaveKeyWithValue("policy", "p"), HaveKeyWithValue("rule", "per-key"), HaveKeyWithValue("key", want),
			HaveKeyWithValue("refused", true), HaveKeyWithValue("retryAfterMs", BeNumerically(">", 0))), line)
	}
	g.Expect(logged).To(BeNumerically(">=", 1))
	g.Expect(s.Log()).NotTo(ContainSubstring("customer-secret"), "no value without topKeys: Values")
	g.Expect(float64(logged)+s.metric(t, "redline_sidecar_decision_log_dropped_total")).To(Equal(float64(refused)),
		"every refusal is logged or counted as dropped")
}
