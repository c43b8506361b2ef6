package sidecartest

import (
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
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
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
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
		Requests: requests, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
		Cost: &policydoc.Cost{From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "redline-cost",
			DefaultHold: defaultHold, MinOutput: minOutput, OnError: onError, TimeoutMS: time.Minute.Milliseconds()},
	}
}
