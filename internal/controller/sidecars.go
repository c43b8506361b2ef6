package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/internal/fleet"
)

// Enforced reasons of reports that were not read.
const (
	// ReasonSidecarReportsOverBound: the policy's group holds more live heartbeats than were
	// left of what the manager reads per namespace (fleet.Summarize); they were counted only.
	ReasonSidecarReportsOverBound = "SidecarReportsOverBound"
	// ReasonNotWritten: the namespace's configuration was not written (see Programmed), so
	// there is nothing to compare the sidecars' reports with; they are not read.
	ReasonNotWritten = "ConfigurationNotWritten"
)

// SidecarReports tells which sidecars enforce a namespace's policies and which configuration
// each applies.
type SidecarReports interface {
	// Summaries tells, of each of policies of namespace, in order, how many sidecars are live,
	// how many apply configuration hash, and how many times they said Redis lost counts of it
	// (fleet.Summary). What it reads of a namespace in all is bounded.
	Summaries(ctx context.Context, namespace, hash string, policies []string) []fleet.Summary
	// TopKeys reads the summaries of top keys the live sidecars of each of policies of
	// namespace published, in order (fleet.ReadSummaries). What it reads of a namespace in all
	// is bounded in bytes.
	TopKeys(ctx context.Context, namespace string, policies []string) []fleet.GroupSummaries
}

// RedisSidecars reads the heartbeats sidecars write to Redis (fleet.Announce).
type RedisSidecars struct {
	Client redis.UniversalClient
	// TTL is how long a sidecar counts as live after its last heartbeat; it must match the
	// sidecars' heartbeat TTL.
	TTL time.Duration
	// MaxMembers is the most heartbeats read of one namespace per reconcile, over all its
	// policies (default fleet.NamespaceMembers).
	MaxMembers int
	// SummaryBytes is the most bytes of top-keys summaries read of one namespace per reading
	// (default fleet.NamespaceSummaryBytes).
	SummaryBytes int
}

// Summaries implements SidecarReports.
func (s *RedisSidecars) Summaries(ctx context.Context, namespace, hash string, policies []string) []fleet.Summary {
	return fleet.Summarize(ctx, s.Client, namespace, hash, policies, s.TTL, s.MaxMembers)
}

// TopKeys implements SidecarReports.
func (s *RedisSidecars) TopKeys(ctx context.Context, namespace string, policies []string) []fleet.GroupSummaries {
	return fleet.ReadSummaries(ctx, s.Client, namespace, policies, nil, s.TTL, s.SummaryBytes)
}

// enforcement is what the sidecars of one policy report.
type enforcement struct {
	// unwritten says the reports were not read: the configuration was not written.
	unwritten bool
	// err is why the reports could not be read.
	err    error
	report fleet.Summary
	// bypass are the Service ports that reach the policy's pods around their sidecars.
	bypass bypass
	// unguarded are the Ready pods the policy selects that run without a sidecar.
	unguarded unguarded
}

// read reports whether the sidecars' reports were read (losses among them).
func (e enforcement) read() bool { return !e.unwritten && e.err == nil }

// enforcements reads the reports of the policies of outcomes that are in the document
// written, in one bounded reading of the namespace; the others are not read at all (a
// document refused, as too large or otherwise, leaves nothing to compare them with).
func (r *NamespaceReconciler) enforcements(ctx context.Context, sidecars SidecarReports, backendErr error, ns, hash string, outcomes []outcome, written bool) []enforcement {
	out := make([]enforcement, len(outcomes))
	var policies []string
	var of []int
	for i := range outcomes {
		switch {
		case !outcomes[i].inDocument():
		case !written:
			out[i].unwritten = true
		case backendErr != nil:
			out[i].err = backendErr
		case sidecars == nil:
			out[i].err = errors.New("sidecar reports are not configured")
		default:
			policies = append(policies, outcomes[i].policy.Name)
			of = append(of, i)
		}
	}
	if len(policies) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, r.redisTimeout())
	defer cancel()
	for k, s := range sidecars.Summaries(ctx, ns, hash, policies) {
		out[of[k]] = enforcement{err: s.Err, report: s}
	}
	return out
}

// condition turns the reports into the Enforced condition for the configuration hash the
// controller last wrote.
func (e enforcement) condition(hash string) (metav1.ConditionStatus, string, string) {
	s := e.report
	switch {
	case e.unwritten:
		return metav1.ConditionUnknown, ReasonNotWritten,
			"the namespace's configuration was not written (see Programmed), so the sidecars' reports are not read"
	case e.unguarded.count > 0:
		return metav1.ConditionFalse, ReasonPodsWithoutSidecar, e.unguarded.message()
	case e.bypass.count > 0:
		return metav1.ConditionFalse, ReasonServiceBypassesSidecar, e.bypass.message()
	case e.err != nil:
		return metav1.ConditionUnknown, ReasonRedisUnavailable,
			truncate("cannot read sidecar heartbeats from Redis: " + e.err.Error())
	case s.OverBound:
		return metav1.ConditionUnknown, ReasonSidecarReportsOverBound, fmt.Sprintf(
			"%d live sidecars report for this policy, more than the %d heartbeats the manager reads of one policy, or than were left "+
				"of the %d it reads of a namespace per reconcile (all its policies together, the smallest groups first): they are counted, not read. "+
				"Have fewer policies select each pod, or split the workloads across namespaces", s.Live, fleet.MaxMembers, s.Bound)
	case s.Live == 0:
		return metav1.ConditionUnknown, ReasonNoSidecars,
			"no live sidecar enforces this policy: no injected pod matches spec.targetSelector yet"
	}
	// A sidecar that started between the count and the read is live but unread: not counted
	// as applying the configuration until the next reconcile reads it.
	current := min(s.Current, s.Live)
	if current == s.Live {
		return metav1.ConditionTrue, ReasonEnforced,
			fmt.Sprintf("%d of %d live sidecars apply configuration %.12s", s.Live, s.Live, hash)
	}
	stale := s.Stale
	if int64(len(stale)) < s.Live-current {
		stale = append(slices.Clip(stale), "...")
	}
	return metav1.ConditionFalse, ReasonPropagating,
		fmt.Sprintf("%d of %d live sidecars apply configuration %.12s; still on an older one: %v",
			current, s.Live, hash, stale)
}
