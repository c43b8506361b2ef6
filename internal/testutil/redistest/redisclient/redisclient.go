// Package redisclient is the one way a test makes a go-redis client of a test server: through
// internal/redisconn, so that it speaks the URL grammar and the options production uses, with
// timeouts a shared test machine can keep, and closed with the test.
//
// It lives beside redistest rather than in it because redisconn's own tests start their
// servers with redistest: redistest importing redisconn would be an import cycle.
package redisclient

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Timeout is what each zero timeout of the options becomes (production's defaults are tens of
// milliseconds): on a busy test machine a reply late by scheduling is not a fault. A test of
// timeouts sets its own.
const Timeout = 10 * time.Second

// New is a client of url (a single server, a cluster's seeds or a Sentinel group, as
// redisconn parses it) with o, closed when t ends. Zero timeouts of o become Timeout.
func New(t testing.TB, url string, o redisconn.Options) redis.UniversalClient {
	t.Helper()
	for _, d := range []*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout} {
		if *d == 0 {
			*d = Timeout
		}
	}
	c, err := redisconn.NewClient(url, o)
	if err != nil {
		t.Fatalf("creating a redis client of %s: %v", url, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Fresh starts a redis-server of t's own and returns New's client of it; both end with t.
func Fresh(t testing.TB, o redisconn.Options) redis.UniversalClient {
	t.Helper()
	srv, err := redistest.Start()
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return New(t, srv.URL(), o)
}
