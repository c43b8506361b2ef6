package rls

import (
	"context"
	"math"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// streamDone says whether a token budget's descriptor reports its stream's usage (a
// hits_addend above 0, the descriptor's or else the request's) rather than starting a request,
// and the usage, bounded as a hold's settle bounds it.
func streamDone(req *rlsv3.RateLimitRequest, desc *rlv3.RateLimitDescriptor) (int64, bool) {
	n := uint64(req.GetHitsAddend())
	if v := desc.GetHitsAddend(); v != nil {
		n = v.GetValue()
	}
	if n == 0 {
		return 0, false
	}
	return int64(min(n, math.MaxInt64)), true
}

// reserve decides hits as DecideHits does, but the hits of token budgets hold their rule's
// defaultHold, each kept under its key until its stream is done.
func (s *Server) reserve(ctx context.Context, set *ruleset.Set, hits []decide.Hit) (decide.Decision, error) {
	d, hs, err := s.Engine.ReserveHits(ctx, set, hits, decide.Need{})
	if err != nil || hs == nil {
		return d, err
	}
	for _, k := range hs.Split() {
		if _, err := s.Holds.Put(k.Holds, k.Key, k.Holds.Deadline()); err != nil {
			// Nobody could settle it: it goes back now, and its usage is charged when it comes.
			_, _ = k.Holds.Settle(ctx, 0, true, false)
		}
	}
	return d, nil
}

// settle ends the oldest open hold of hit's key with the usage of a stream that is done, or
// charges it where there is none. A stream that is done is never refused: st stays OK.
func (s *Server) settle(ctx context.Context, set *ruleset.Set, st *rlsv3.RateLimitResponse_DescriptorStatus, r *ruleset.Rule, hit decide.Hit, used int64) {
	st.CurrentLimit = currentLimit(r)
	st.DurationUntilReset = durationpb.New(r.Limit.Window)
	key, _, ok := decide.HitKey(set, hit)
	if !ok {
		return
	}
	if hs := s.Holds.TakeOldest(key); hs != nil {
		_, _ = hs.Settle(ctx, used, true, false)
		return
	}
	_, _ = s.Engine.Charge(ctx, set, hit, used)
}
