// Package rls serves Envoy's rate limit service, envoy.service.ratelimit.v3.RateLimitService,
// so that an Envoy or Istio gateway can use the sidecar as its global rate limit service.
//
// Descriptors map to rules like this:
//
//   - a descriptor with entries "policy" and "rule" selects that rule of the policy; the values
//     of its other entries, in order, are the key parts;
//   - otherwise a "generic_key" entry whose value is "<policy>/<rule>" selects that rule, and
//     the values of the other entries are the key parts;
//   - a descriptor that selects no rule enforced by this sidecar is answered OK with no limit,
//     as Envoy's reference service does for descriptors it has no configuration for.
//
// For example, with Envoy actions
//
//   - generic_key: {descriptor_key: policy, descriptor_value: checkout-per-key}
//   - generic_key: {descriptor_key: rule, descriptor_value: per-api-key}
//   - request_headers: {header_name: x-api-key, descriptor_key: api_key}
//
// the counter is the one the proxy uses for a request with that X-API-Key. The domain is not
// used: the sidecar enforces the policies of its own namespace. hits_addend (per descriptor, or
// else per request) is the cost, unsigned as Envoy sends it: a cost beyond what the rule can
// ever admit is refused, never wrapped. Descriptors with is_negative_hits are answered without
// counting.
//
// A rule whose cost comes from the response (a token budget) follows Envoy's
// apply_on_stream_done. Envoy sends the descriptors of a route's rate_limits entries without
// apply_on_stream_done when the request starts, and those of the entries with it when the
// stream is done (for every request whose start call it made, refused ones included); a
// descriptor's hits_addend is set only when its entry configures one, and then even when it
// is 0, and an entry whose hits_addend format does not resolve (no usage in the metadata) is
// not sent. The sidecar expects two entries with the same actions: the start entry without
// hits_addend, and the stream-done entry with apply_on_stream_done and hits_addend the
// response's usage (a format on its metadata). So:
//
//   - a descriptor without hits_addend (and a request-level one of 0) starts a request: it
//     holds the rule's defaultHold (the service never sees the body to size it; a rule with
//     cost.unsizedBody Refuse answers it OVER_LIMIT, holding nothing);
//   - a descriptor with hits_addend set, 0 included (or without one, in a request whose
//     hits_addend is above 0), is a stream-done call with that usage: it settles the oldest
//     open hold of its key with it (0 gives the whole hold back), and is never refused;
//   - a start that keeps no hold (refused by any rule, for want of room or of a size) owes its
//     stream-done call, which reports no usage: a stream-done call of 0 pays a refusal owed
//     under its key back before it settles anything (decide.Registry.Owe), so a refusal never
//     ends a running request's hold; a usage above 0 is never a refusal's and never pays. A
//     refusal owed is forgotten after the rule's hold timeout (its stream-done call was
//     dropped by Envoy, or never came).
//
// A usage that finds no hold of its key here (its request reached another replica, or its
// hold was forgotten) is charged as it is; the hold elsewhere goes back at its deadline. A
// setup whose usage is only the request-level hits_addend (the stream's filter state) cannot
// tell a usage of 0 from a start: such a call is read as a start. See budgets.go.
//
// The service runs on grpc-go with go-control-plane's generated types (server.go), next to
// grpc's standard health service.
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Descriptor entry keys that select a rule.
const (
	EntryPolicy     = "policy"
	EntryRule       = "rule"
	EntryGenericKey = "generic_key"
)

// Bounds of one ShouldRateLimit request, beyond the message size the server accepts.
const (
	// MaxDescriptors is the most descriptors a request may carry: as many as a policy can have
	// rules, so one request can reach each rule of a policy once.
	MaxDescriptors = 32
	// MaxEntries is the most entries one descriptor may carry: policy, rule and up to 14 key
	// parts (a rule's key has at most 8).
	MaxEntries = 16
)

// Server is the rate limit service.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	Engine *decide.Engine
	Store  *ruleset.Store
	// Holds keeps the holds of token budgets' descriptors until their stream is done (nil:
	// such descriptors are decided as plain ones, one unit each).
	Holds *decide.Registry
	// OnUnsized hears of each descriptor refused for want of a size (metrics).
	OnUnsized func(rule *ruleset.Rule, reason string)
	// Slots keeps the slots of in-flight descriptors until their stream is done (nil: such
	// descriptors are answered OK, counting nothing).
	Slots *decide.SlotRegistry
}

// ReasonDescriptorWithoutSize is the reason a token budget's descriptor is refused under
// cost.unsizedBody: Refuse, in the metric: Envoy's filter never sends a request's size.
const ReasonDescriptorWithoutSize = "descriptor_without_size"

// ShouldRateLimit decides every descriptor in one batch; the request is over limit when any
// Enforce rule refuses. Its errors are gRPC statuses: Unavailable without policies,
// InvalidArgument for a request without descriptors or beyond the bounds.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	set := s.Store.Current()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "no policies loaded")
	}
	if err := validate(req); err != nil {
		return nil, err
	}
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors)),
	}
	c := s.collectHits(ctx, set, req, resp)
	kept, held := false, false // whether this request's descriptors keep their slots, holds
	defer func() {
		if !kept {
			s.oweSlots(set, c.slotHits)
		}
		if !held {
			s.oweHolds(set, c.starts)
		}
	}()
	if c.unsized {
		// refused as a whole before anything is held or counted
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		return resp, nil
	}
	if len(c.hits) == 0 && len(c.slotHits) == 0 {
		return resp, nil
	}
	d, full, slots, err := s.decideAll(ctx, set, c.hits, c.slotHits, c.holds)
	if err != nil {
		if errors.Is(err, decide.ErrUnknownRule) { // the set changed since Find: nothing enforces it
			return resp, nil
		}
		return nil, status.Error(codes.Internal, fmt.Sprintf("deciding: %v", err))
	}
	held = full == nil && d.Allowed && !slots.Refuses()
	kept = held && slots != nil
	writeDecision(resp, d, c.at, slots, c.slotHits)
	if full != nil {
		refuseNoRoom(set, resp, c.hits, c.at, full)
	}
	return resp, nil
}

// collected is what collectHits read of a request's descriptors: hits per window (at[i] is
// the descriptor of hits[i]), in-flight hits, the token budgets' start descriptors (whether a
// hit opens a hold), and whether a token budget's descriptor was refused for want of a size.
type collected struct {
	hits     []decide.Hit
	at       []int
	slotHits []slotHit
	starts   []budgetStart
	holds    bool
	unsized  bool
}

// collectHits reads the descriptors of req that name a rule of set, releases the slots of
// in-flight descriptors that end a stream, settles the token budgets' ones that end a stream,
// and refuses in resp those a token budget cannot size.
func (s *Server) collectHits(ctx context.Context, set *ruleset.Set, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) (c collected) {
	c.hits = make([]decide.Hit, 0, len(req.Descriptors))
	c.at = make([]int, 0, len(req.Descriptors))
	for i, desc := range req.Descriptors {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		hit, ok := HitFor(desc)
		if !ok {
			continue
		}
		if r := set.FindInFlight(hit.Policy, hit.Rule); r != nil && s.Slots != nil {
			if desc.GetIsNegativeHits() {
				s.endSlot(ctx, set, hit)
				continue
			}
			c.slotHits = append(c.slotHits, slotHit{hit: hit, at: i})
			continue
		}
		r := set.Find(hit.Policy, hit.Rule)
		if r == nil || desc.GetIsNegativeHits() {
			continue
		}
		hit.Cost = Cost(req.GetHitsAddend(), desc.GetHitsAddend())
		if r.Cost != nil && s.Holds != nil {
			if used, done := streamDone(req, desc); done {
				s.settle(ctx, set, resp.Statuses[i], r, hit, used)
				continue
			}
			c.starts = append(c.starts, budgetStart{hit: hit, rule: r})
			if r.Cost.RefuseUnsized && !r.Shadow {
				// the filter never sends the body: the rule cannot size this request
				resp.Statuses[i].Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.Statuses[i].CurrentLimit = currentLimit(r)
				c.unsized = true
				if s.OnUnsized != nil {
					s.OnUnsized(r, ReasonDescriptorWithoutSize)
				}
				continue
			}
			c.holds = true
		}
		c.hits = append(c.hits, hit)
		c.at = append(c.at, i)
	}
	return c
}

// writeDecision puts d and slots into resp: each hit's status (at[j] is the descriptor of
// outcome j), each in-flight hit's, the overall code and the RateLimit headers.
func writeDecision(resp *rlsv3.RateLimitResponse, d decide.Decision, at []int, slots *decide.Slots, slotHits []slotHit) {
	for j := range d.Outcomes {
		o := &d.Outcomes[j]
		st := resp.Statuses[at[j]]
		st.CurrentLimit = currentLimit(o.Rule)
		st.LimitRemaining = uint32(min(max(o.Result.Remaining, 0), math.MaxUint32))
		st.DurationUntilReset = durationpb.New(o.Result.ResetAfter)
		if o.Refuses() {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if !d.Allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	f := d.Fields()
	if slots != nil {
		slotStatuses(resp, slots, slotHits)
		if slots.Refused != nil {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			f.RetryAfter = ""
		}
		slots.WriteFields(&f)
	}
	if f.Policy != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: decide.HeaderPolicy, Value: f.Policy},
			&corev3.HeaderValue{Key: decide.HeaderRateLimit, Value: f.RateLimit})
	}
	if f.RetryAfter != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: decide.HeaderRetryAfter, Value: f.RetryAfter})
	}
}

// validate refuses what no well-formed Envoy request carries, before any work is done.
func validate(req *rlsv3.RateLimitRequest) error {
	switch n := len(req.Descriptors); {
	case n == 0:
		return status.Error(codes.InvalidArgument, "no descriptors")
	case n > MaxDescriptors:
		return status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d are accepted", n, MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if n := len(d.GetEntries()); n > MaxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d are accepted", i, n, MaxEntries)
		}
	}
	return nil
}

// Cost is the cost of one descriptor as Envoy documents hits_addend: the descriptor's value
// when set and not 0, else the request's when not 0, else 1. Values beyond math.MaxInt64 stay
// beyond every limit (they are refused as never admissible), they do not wrap.
func Cost(request uint32, descriptor *wrapperspb.UInt64Value) int64 {
	cost := uint64(request)
	if descriptor != nil {
		cost = descriptor.GetValue()
	}
	switch {
	case cost == 0:
		return 1
	case cost > math.MaxInt64:
		return math.MaxInt64
	}
	return int64(cost)
}

// HitFor maps a descriptor to a rule and its key parts (see the package documentation).
func HitFor(d *rlv3.RateLimitDescriptor) (decide.Hit, bool) {
	var h decide.Hit
	generic := -1
	entries := d.GetEntries()
	for i, e := range entries {
		switch e.GetKey() {
		case EntryPolicy:
			h.Policy = e.GetValue()
		case EntryRule:
			h.Rule = e.GetValue()
		case EntryGenericKey:
			if generic < 0 && strings.Contains(e.GetValue(), "/") {
				generic = i
			}
		}
	}
	skip := -1
	if h.Policy == "" || h.Rule == "" {
		if generic < 0 {
			return decide.Hit{}, false
		}
		h.Policy, h.Rule, _ = strings.Cut(entries[generic].GetValue(), "/")
		skip = generic
	}
	for i, e := range entries {
		if i == skip || (skip < 0 && (e.GetKey() == EntryPolicy || e.GetKey() == EntryRule)) {
			continue
		}
		h.Key = append(h.Key, e.GetValue())
	}
	return h, h.Policy != "" && h.Rule != ""
}

// currentLimit expresses a rule's window in the largest unit that divides it.
func currentLimit(r *ruleset.Rule) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{
		Name:            r.ID,
		RequestsPerUnit: uint32(min(r.Limit.Requests, math.MaxUint32)),
		Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
	}
	if c := r.Limit.Calendar; c != nil {
		// A calendar period in its own unit: a day, a week or a month, whatever its length.
		l.Unit = map[calendar.Unit]rlsv3.RateLimitResponse_RateLimit_Unit{calendar.Day: rlsv3.RateLimitResponse_RateLimit_DAY,
			calendar.Week: rlsv3.RateLimitResponse_RateLimit_WEEK, calendar.Month: rlsv3.RateLimitResponse_RateLimit_MONTH}[c.Spec().Unit]
		return l
	}
	secs := r.WindowSeconds
	for _, u := range []struct {
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		secs int64
	}{{rlsv3.RateLimitResponse_RateLimit_DAY, 86400}, {rlsv3.RateLimitResponse_RateLimit_HOUR, 3600}, {rlsv3.RateLimitResponse_RateLimit_MINUTE, 60}} {
		if secs >= u.secs && secs%u.secs == 0 {
			l.Unit, secs = u.unit, secs/u.secs
			break
		}
	}
	if secs != 1 {
		l.UnitMultiplier = wrapperspb.UInt32(uint32(min(secs, math.MaxUint32)))
	}
	return l
}
