package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// changeAndBreak is step 5: a policy change through the API, then a Redis outage.
func (d *demo) changeAndBreak(ctx context.Context) error {
	d.step(5, fmt.Sprintf("Change the limit to %d with the API, then stop Redis for %s", updatedLimit, outage))
	if err := d.update(ctx); err != nil {
		return err
	}
	return d.outage(ctx)
}

// update applies the new limit and times how long until every replica enforces it.
func (d *demo) update(ctx context.Context) error {
	old := d.policy.Spec.Rules[0].Limit.Requests
	// Promoting the candidate is an edit of the spec: its limit becomes the rule's.
	d.policy.Spec.Rules[0].Limit.Requests = d.policy.Spec.Rules[0].Candidate.Limit.Requests
	d.policy.Spec.Rules[0].Candidate = nil
	start := time.Now()
	if err := d.st.ApplyPolicy(ctx, d.policy); err != nil {
		return err
	}
	d.say("  promoted the candidate: applied %s with limit %d (was %d) and no candidate, as `kubectl apply --server-side` would", d.policy.Name, updatedLimit, old)
	took, err := d.untilExact(ctx, updatedLimit, start, time.Minute)
	if err != nil {
		return fmt.Errorf("waiting for the new limit: %w", err)
	}
	d.say("  all 3 replicas enforce the new limit %s after the apply", seconds(took))
	d.say("  (the demo syncs the mounted ConfigMap every 200ms; a real kubelet takes up to about a minute)")
	_, t, err := d.measure(ctx, "Redline after the update", 3*updatedLimit)
	if err != nil {
		return err
	}
	d.say("  %d requests with a new key: admitted %s = %d", t.Sent, perTarget(t), t.Admitted)
	return nil
}

// outage stops Redis, shows LocalFallback at work and times the recovery.
func (d *demo) outage(ctx context.Context) error {
	fallback := d.policy.Name
	d.say("  waiting until every sidecar's heartbeat in Redis counts 3 live replicas (LocalFallback divides by it)")
	if err := d.waitReplicas(ctx, fallback, 30*time.Second); err != nil {
		return err
	}
	if err := d.phase(ctx, phaseOutage); err != nil {
		return err
	}
	if err := d.st.Redis.Stop(); err != nil {
		return fmt.Errorf("stopping redis: %w", err)
	}
	stopped := time.Now()
	d.say("  redis-server killed (SIGKILL)")
	local := map[string]string{"source": "fallback"}
	localBefore, err := sumMetric(ctx, d.sidecars, "redline_sidecar_decisions_total", local)
	if err != nil {
		return err
	}
	r, t, err := d.measure(ctx, "Redline, Redis down (LocalFallback)", 3*updatedLimit)
	if err != nil {
		return err
	}
	localAfter, err := sumMetric(ctx, d.sidecars, "redline_sidecar_decisions_total", local)
	if err != nil {
		return err
	}
	d.say("  %d requests while Redis is down: admitted %s = %d", t.Sent, perTarget(t), t.Admitted)
	d.say("  failureMode LocalFallback: each replica enforces limit/replicas = %d/%d = %d by itself",
		updatedLimit, replicas, updatedLimit/replicas)
	d.say("  (%.0f of %d decisions made locally; the %.2f Redis calls per decision are failed attempts:",
		localAfter-localBefore, t.Sent, r.callsPerDecision)
	d.say("  a circuit breaker stops trying after 5 failures in a row and probes once a second)")
	d.say("  Open would have admitted all %d requests, Closed would have refused them all.", t.Sent)
	if reason, err := d.programmedReason(ctx, false, 15*time.Second); err == nil {
		d.say("  the controller reports it too: Programmed=False, reason %s", reason)
	}

	if wait := outage - time.Since(stopped); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	if err := d.phase(ctx, phaseBack); err != nil {
		return err
	}
	if err := d.st.Redis.Start(); err != nil {
		return fmt.Errorf("restarting redis: %w", err)
	}
	d.say("  redis-server started again after %s, empty (no persistence)", seconds(time.Since(stopped)))
	took, err := d.untilExact(ctx, updatedLimit, time.Now(), time.Minute)
	if err != nil {
		return fmt.Errorf("waiting for shared counting to resume: %w", err)
	}
	d.say("  the sidecars decide against the shared counter again %s after the restart", seconds(took))
	if _, err := d.programmedReason(ctx, true, time.Minute); err != nil {
		return err
	}
	d.say("  the manager loaded the scripts into the new Redis: Programmed=True")
	_, t, err = d.measure(ctx, "Redline, Redis back", 3*updatedLimit)
	if err != nil {
		return err
	}
	d.say("  %d requests with a new key: admitted %s = %d", t.Sent, perTarget(t), t.Admitted)
	return nil
}

// untilExact probes with fresh keys until the replicas together admit exactly limit, and
// returns how long it has been since start. A probe sends limit+9 requests one at a time, round-robin, so
// that every replica sees requests past the limit: one replica on another limit, or deciding
// without Redis, would admit a different number.
func (d *demo) untilExact(ctx context.Context, limit int, start time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		t := d.send(ctx, limit+3*replicas, 1, d.request(d.key()))
		if t.Failed == 0 && t.Admitted == limit {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("after %s the replicas still admit %d of %d (limit %d)", timeout, t.Admitted, t.Sent, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReplicas waits until every sidecar counts all replicas for policy.
func (d *demo) waitReplicas(ctx context.Context, policy string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		all := true
		for _, sc := range d.sidecars {
			v, err := sc.Metric(ctx, "redline_sidecar_policy_replicas", map[string]string{"policy": policy})
			if err != nil {
				return err
			}
			all = all && v == replicas
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sidecars do not count %d replicas of %s after %s", replicas, policy, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// programmedReason waits until the policy's Programmed condition is want and returns its reason.
func (d *demo) programmedReason(ctx context.Context, want bool, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		var p v1alpha1.RateLimitPolicy
		if err := d.st.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: d.policy.Name}, &p); err != nil {
			return "", fmt.Errorf("reading policy status: %w", err)
		}
		if c := meta.FindStatusCondition(p.Status.Conditions, "Programmed"); c != nil &&
			(c.Status == "True") == want && c.ObservedGeneration == p.Generation {
			return c.Reason, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("policy %s: Programmed did not become %t within %s", d.policy.Name, want, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// summary prints the final table.
func (d *demo) summary() {
	d.say("")
	d.say("Summary (%s in all):", seconds(time.Since(d.began)))
	d.say("")
	printTable(d.out, d.rows)
	d.say("")
	d.say("Three replicas that each count in memory admit three times the limit. Redline's sidecars")
	d.say("share one atomic counter in Redis and admit the limit, follow policy changes made with the")
	d.say("API, fall back to limit/replicas each while Redis is down, and share the counter again")
	d.say("when it returns. Next: docs/getting-started.md, config/samples/, and `make test-e2e` for the same story as assertions.")
}
