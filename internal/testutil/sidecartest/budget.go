package sidecartest

import (
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// Limiter returns a limiter with default options on a redis-server of its own, both stopped
// when the test ends.
func Limiter(t testing.TB) *limiter.Limiter {
	t.Helper()
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	// The tests using it judge what is admitted and spent, not how fast: on a machine busy
	// enough, 32 callers waited past go-redis's default pool wait (ReadTimeout + 1s) for one of
	// its connections and a settle failed with "connection pool timeout". A wait bounded by
	// the test's own deadline instead.
	c := redisclient.New(t, srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: time.Minute})
	lim, err := limiter.New(c, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	return lim
}

// BudgetRule is an enforced rule named name whose cost comes from the response: requests
// tokens a minute by algorithm, keyed on header keyHeader, holding defaultHold for a body it
// cannot size, at least minOutput of output, settling failures by onError, holds waiting a
// minute.
func BudgetRule(name, keyHeader, algorithm string, requests, defaultHold, minOutput int64, onError string) policydoc.Rule {
	return policydoc.Rule{
		Name: name, Key: []policydoc.KeyPart{{Header: keyHeader}}, Algorithm: algorithm,
		Requests: requests, WindowMS: time.Minute.Milliseconds(), Mode: modeEnforce,
		Cost: &policydoc.Cost{From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "redline-cost",
			DefaultHold: defaultHold, MinOutput: minOutput, OnError: onError, TimeoutMS: time.Minute.Milliseconds()},
	}
}

// InFlightRule is an enforced in-flight rule named name: at most n requests of a key in
// progress at once, keyed on header keyHeader.
func InFlightRule(name, keyHeader string, n int64) policydoc.Rule {
	return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: keyHeader}}, InFlight: n, Mode: modeEnforce}
}

// WindowRule is an enforced rule named name of requests a day by FixedWindow, keyed on header
// keyHeader: a test's few seconds cross no window's end, given AwayFromDayEnd.
func WindowRule(name, keyHeader string, requests int64) policydoc.Rule {
	return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: keyHeader}}, Algorithm: "FixedWindow",
		Requests: requests, WindowMS: (24 * time.Hour).Milliseconds(), Mode: modeEnforce}
}

// AwayFromDayEnd waits for the next day (on this machine's clock, which is Redis's on
// loopback) when the current one ends within a few minutes, so that a day-long window holds
// for the whole test.
func AwayFromDayEnd(t testing.TB) {
	t.Helper()
	const day, margin = 24 * time.Hour, 3 * time.Minute
	now := time.Now()
	if left := now.Truncate(day).Add(day).Sub(now); left < margin {
		t.Logf("waiting %s for the next day", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
}

// modeEnforce is the mode of the rules built here.
const modeEnforce = "Enforce"
