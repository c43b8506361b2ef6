package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// streamDone says whether a token budget's descriptor is a stream-done call (Envoy's
// apply_on_stream_done) rather than a request's start, and the usage it reports, bounded as
// a hold's settle bounds it. Envoy sets a descriptor's hits_addend only when its rate_limits
// entry configures one, and then even when it is 0: the entry sent when the stream is done
// configures it (the usage from the response's metadata), the entry sent at the start does
// not. So a descriptor with hits_addend set, 0 included, is a stream-done call; one without
// is a start, unless the request's hits_addend (from the stream's filter state, for a setup
// without a per-descriptor one) is above 0. A request-level usage of 0 cannot be told from a
// start: the package documentation says what configuration avoids it.
func streamDone(req *rlsv3.RateLimitRequest, desc *rlv3.RateLimitDescriptor) (int64, bool) {
	if v := desc.GetHitsAddend(); v != nil {
		return int64(min(v.GetValue(), math.MaxInt64)), true
	}
	if n := req.GetHitsAddend(); n > 0 {
		return int64(n), true
	}
	return 0, false
}

// budgetStart is a token budget's start descriptor: when its request keeps no hold (refused
// by any rule, or for want of room or a size), its key owes the request's stream-done call.
type budgetStart struct {
	hit  decide.Hit
	rule *ruleset.Rule
}

// oweHolds records, for each token budget's start descriptor of a request that keeps no
// hold, that a stream-done call under its key reporting no usage settles no hold (see
// decide.Registry.Owe), until the hold's timeout it would have had.
func (s *Server) oweHolds(set *ruleset.Set, starts []budgetStart) {
	for _, b := range starts {
		if key, _, ok := decide.HitKey(set, b.hit); ok {
			s.Holds.Owe(key, holdTimeout(b.rule))
		}
	}
}

// holdTimeout is how long a rule's hold waits for its settle, so how long a refusal's
// stream-done call is waited for.
func holdTimeout(r *ruleset.Rule) time.Duration {
	if r.Cost != nil && r.Cost.Timeout > 0 {
		return r.Cost.Timeout
	}
	return decide.DefaultGrace
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
// charges it where there is none. A stream-done call that reports no usage pays back a
// refusal owed under the key first (decide.Registry.Owe): a refused request reports none, and
// must not end a running request's hold. A stream that is done is never refused: st stays OK,
// with the rule's limit and no duration_until_reset: Envoy discards the answer to a
// stream-done call, and the time to the window's end (a calendar period's, in its zone) is
// Redis's to say, which a settle does not ask.
func (s *Server) settle(ctx context.Context, set *ruleset.Set, st *rlsv3.RateLimitResponse_DescriptorStatus, r *ruleset.Rule, hit decide.Hit, used int64) {
	st.CurrentLimit = currentLimit(r)
	key, _, ok := decide.HitKey(set, hit)
	if !ok {
		return
	}
	if used == 0 && s.Holds.PayOwed(key) {
		return
	}
	if hs := s.Holds.TakeOldest(key); hs != nil {
		_, _ = hs.Settle(ctx, used, true, false)
		return
	}
	if used > 0 {
		_, _ = s.Engine.Charge(ctx, set, hit, used)
	}
}
