package backend

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
)

// Sidecars reads what the sidecars of one Redis publish there: their heartbeats (which
// configuration each applies, fleet.Announce) and their top-keys summaries.
type Sidecars struct {
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

// Summaries tells, of each of policies of namespace, in order, how many sidecars are live,
// how many apply configuration hash, and how many times they said Redis lost counts of it
// (fleet.Summary). What it reads of a namespace in all is bounded.
func (s *Sidecars) Summaries(ctx context.Context, namespace, hash string, policies []string) []fleet.Summary {
	return fleet.Summarize(ctx, s.Client, namespace, hash, policies, s.TTL, s.MaxMembers)
}

// TopKeys reads the summaries of top keys the live sidecars of each of policies of namespace
// published, in order (fleet.ReadSummaries). What it reads of a namespace in all is bounded
// in bytes.
func (s *Sidecars) TopKeys(ctx context.Context, namespace string, policies []string) []fleet.GroupSummaries {
	return fleet.ReadSummaries(ctx, s.Client, namespace, policies, nil, s.TTL, s.SummaryBytes)
}
