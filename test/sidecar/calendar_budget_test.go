package sidecar_test

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// A token budget of 2,000 a day in Berlin, through the proxy, on the day Berlin's clocks go
// forward (Redis's clock moved there, the sidecar's years away): requests hold, are capped to
// what is left and settle what the model says it used, until the day's budget is spent. The
// model serves no more than the budget, and every answer's RateLimit fields give the 23-hour
// day and the time to Berlin's midnight on Redis's clock.
func TestCalendarTokenBudgetThroughTheProxy(t *testing.T) {
	awayFromDayEnd(t) // the model counts what it serves by UTC day
	g := NewWithT(t)
	redisAt, _ := time.Parse(time.RFC3339, "2028-03-26T12:00:00+02:00")
	end, _ := time.Parse(time.RFC3339, "2028-03-27T00:00:00+02:00")
	rs, err := redistest.StartAt(redisAt)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = rs.Close() })
	const budget = 2000
	r := sidecartest.BudgetRule("tokens", "X-API-Key", "FixedWindow", budget, 100, 1, policydoc.OnErrorUsed)
	r.WindowMS, r.Calendar = 26*3600*1000, &policydoc.Calendar{Unit: "Day", Zone: "Europe/Berlin"}
	r.Match = &policydoc.Match{PathPrefix: "/v1"}
	e := newEnv(t, "app")
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "app", r))
	m := newCountingModel(t)
	s := start(t, "pod-0", e, rs.URL(), strings.TrimPrefix(m.URL, "http://"), true)
	rc := rs.Client("")
	t.Cleanup(func() { _ = rc.Close() })
	redisNow := func() time.Time {
		now, err := rc.Time(t.Context()).Result()
		g.Expect(err).NotTo(HaveOccurred())
		return now
	}

	key := fmt.Sprint("cal-", time.Now().UnixNano())
	before := redisNow()
	var admitted int
	refused := false
	for i := 0; i < 20 && !refused; i++ {
		req, err := http.NewRequest(http.MethodPost, s.proxy+"/v1/chat/completions",
			bytes.NewReader(chatBody(`,"max_tokens":300`)()))
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", key)
		resp, err := httpClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		after := redisNow()
		g.Expect(resp.Header.Get("RateLimit-Policy")).To(Equal(`"llm/tokens";q=2000;w=82800`), "request %d", i)
		var left, secs int64
		_, err = fmt.Sscanf(resp.Header.Get("RateLimit"), `"llm/tokens";r=%d;t=%d`, &left, &secs)
		g.Expect(err).NotTo(HaveOccurred(), resp.Header.Get("RateLimit"))
		lo, hi := int64(end.Sub(after).Seconds()), int64(math.Ceil(end.Sub(before).Seconds()))
		g.Expect(secs).To(And(BeNumerically(">=", lo), BeNumerically("<=", hi)), "request %d: seconds to Berlin's midnight", i)
		switch resp.StatusCode {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused = true
			ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ra).To(And(BeNumerically(">=", 1), BeNumerically("<=", hi)))
		default:
			t.Fatalf("request %d answered %d", i, resp.StatusCode)
		}
	}
	served := m.maxPerWindow(key)
	t.Logf("Berlin's 23-hour day, a budget of %d tokens: %d requests admitted, %d tokens served, then refused", budget, admitted, served)
	g.Expect(refused).To(BeTrue(), "the day's budget ran out")
	g.Expect(served).To(BeNumerically("<=", budget), "the model served no more than the day's budget")
	g.Expect(served).To(BeNumerically(">", budget-300), "what was left went to the last request, capped")
}
