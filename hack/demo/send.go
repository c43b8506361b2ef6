package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/redline-dev/redline/internal/testutil/stack"
)

// measure sends n requests with a fresh key through the sidecars and records a table row.
func (d *demo) measure(ctx context.Context, name string, n int) (row, stack.Tally, error) {
	rule := d.policy.Spec.Rules[0]
	before, err := sumMetric(ctx, d.sidecars, "redline_sidecar_redis_round_trips_total", nil)
	if err != nil {
		return row{}, stack.Tally{}, err
	}
	t := d.sendPaced(ctx, n, 12, d.request(d.key()))
	if err := failed(t); err != nil {
		return row{}, t, err
	}
	after, err := sumMetric(ctx, d.sidecars, "redline_sidecar_redis_round_trips_total", nil)
	if err != nil {
		return row{}, t, err
	}
	r := row{name: name, limit: int(rule.Limit.Requests), window: rule.Limit.Window.Duration, replicas: replicas,
		sent: t.Sent, admitted: t.Admitted, callsPerDecision: (after - before) / float64(t.Sent)}
	d.rows = append(d.rows, r)
	return r, t, d.obs.measured(r, t)
}

// request builds the demo's request with API key key.
func (d *demo) request(key string) func(int) stack.Request {
	return func(int) stack.Request {
		return stack.Request{Method: http.MethodPost, Path: path, Header: http.Header{keyHeader: {key}}}
	}
}

// key returns an API key not used before, so each measurement starts from an empty counter.
func (d *demo) key() string {
	d.keySeq++
	return fmt.Sprintf("demo-key-%d", d.keySeq)
}

// send sends n requests through the sidecars at once and counts them in the phase under way.
func (d *demo) send(ctx context.Context, n, concurrency int, req func(int) stack.Request) stack.Tally {
	t := stack.Send(ctx, d.proxies, n, concurrency, req)
	d.obs.count(t)
	return t
}

// The measurements' pace: chunks of paceChunk requests (a multiple of the replicas, so the
// round-robin is the same as in one run) every paceEvery, 100 requests per second. Spread
// over seconds, Prometheus's 1 s scrapes show each phase as rates, not one burst.
const (
	paceChunk = 4 * replicas
	paceEvery = 120 * time.Millisecond
)

// sendPaced sends n requests through the sidecars at the measurements' pace and counts them
// in the phase under way.
func (d *demo) sendPaced(ctx context.Context, n, concurrency int, req func(int) stack.Request) stack.Tally {
	total := stack.Tally{PerTarget: make([]stack.Counts, len(d.proxies))}
	tick := time.NewTicker(paceEvery)
	defer tick.Stop()
	start := time.Now()
	for sent := 0; sent < n && ctx.Err() == nil; sent += paceChunk {
		if sent > 0 {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		t := d.send(ctx, min(paceChunk, n-sent), concurrency, func(i int) stack.Request { return req(sent + i) })
		for i, c := range t.PerTarget {
			p := &total.PerTarget[i]
			p.Sent, p.Admitted, p.Limited, p.Failed = p.Sent+c.Sent, p.Admitted+c.Admitted, p.Limited+c.Limited, p.Failed+c.Failed
		}
		total.Sent, total.Admitted, total.Limited, total.Failed = total.Sent+t.Sent, total.Admitted+t.Admitted, total.Limited+t.Limited, total.Failed+t.Failed
		if total.FirstFailure == "" {
			total.FirstFailure = t.FirstFailure
		}
	}
	total.Elapsed = time.Since(start)
	return total
}

func failed(t stack.Tally) error {
	if t.Failed > 0 {
		return fmt.Errorf("%d of %d requests failed; first: %s", t.Failed, t.Sent, t.FirstFailure)
	}
	return nil
}
