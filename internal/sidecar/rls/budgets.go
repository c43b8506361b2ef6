package rls

import (
	"context"
	"errors"
	"math"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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

// noRoom is a request whose holds the registry had no room for: Key names the limiter key
// refused.
type noRoom struct {
	Key string
	Err *decide.RefusedError
}

// reserve decides plan as Decide does, but the hits of token budgets hold their rule's
// defaultHold, each kept under its key until its stream is done. When the registry has no room
// for them (decide.Registry), the request is refused (refused non-nil) and every hold it took
// goes back at once: a request is never admitted with a hold nobody could settle.
func (s *Server) reserve(ctx context.Context, plan *decide.Plan) (d decide.Decision, refused *noRoom, err error) {
	d, hs, err := s.Engine.Reserve(ctx, plan, decide.Need{})
	if err != nil || hs == nil {
		return d, nil, err
	}
	split := hs.Split()
	i, err := s.Holds.PutSplit(split)
	if err == nil {
		return d, nil, nil
	}
	for _, k := range split {
		_, _ = k.Holds.Settle(ctx, 0, true, false)
	}
	d.GiveBack(ctx) // refused: what the other rules counted goes back too
	re, ok := errors.AsType[*decide.RefusedError](err)
	if !ok {
		return d, nil, err
	}
	return d, &noRoom{Key: split[i].Key, Err: re}, nil
}

// refuseNoRoom turns an admitted answer into OVER_LIMIT for a request the registry had no room
// for: the descriptors of the refused key say OVER_LIMIT, and Retry-After says when a hold in
// the way will have passed its deadline. OVER_LIMIT rather than an error: Envoy's rate limit
// filter admits on an error unless failure_mode_deny is set, and that default would admit the
// request without a hold.
func refuseNoRoom(set *ruleset.Set, resp *rlsv3.RateLimitResponse, hits []decide.Hit, at []int, nr *noRoom) {
	resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	for j, h := range hits {
		if key, _, ok := decide.HitKey(set, h); ok && key == nr.Key {
			resp.Statuses[at[j]].Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	retry := strconv.FormatInt(max(decide.CeilSeconds(nr.Err.RetryAfter), 1), 10)
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == decide.HeaderRetryAfter {
			h.Value = retry
			return
		}
	}
	resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: decide.HeaderRetryAfter, Value: retry})
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
