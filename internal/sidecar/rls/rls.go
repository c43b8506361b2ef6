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
// else per request) is the cost; descriptors with is_negative_hits are answered without counting.
package rls

import (
	"context"
	"errors"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/sidecar/config"
	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// Descriptor entry keys that select a rule.
const (
	EntryPolicy     = "policy"
	EntryRule       = "rule"
	EntryGenericKey = "generic_key"
)

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	Engine *decide.Engine
	Store  *config.Store
}

// ShouldRateLimit decides every descriptor; the request is over limit when any Enforce rule
// refuses.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	set := s.Store.Current()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "no policies loaded")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no descriptors")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	all := decide.Decision{Allowed: true}
	for _, desc := range req.GetDescriptors() {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses = append(resp.Statuses, st)
		hit, ok := HitFor(desc)
		if !ok || desc.GetIsNegativeHits() || set.Find(hit.Policy, hit.Rule) == nil {
			continue
		}
		cost := int64(req.GetHitsAddend())
		if desc.GetHitsAddend() != nil {
			cost = int64(desc.GetHitsAddend().GetValue())
		}
		cost = max(cost, 1)
		d, err := s.Engine.DecideHits(ctx, set, []decide.Hit{hit}, cost)
		if err != nil {
			if errors.Is(err, decide.ErrUnknownRule) {
				continue
			}
			return nil, status.Errorf(codes.Internal, "deciding %s/%s: %v", hit.Policy, hit.Rule, err)
		}
		o := &d.Outcomes[0]
		st.CurrentLimit = currentLimit(o.Rule)
		st.LimitRemaining = uint32(min(max(o.Result.Remaining, 0), 1<<32-1))
		st.DurationUntilReset = durationpb.New(o.Result.ResetAfter)
		if o.Refuses() {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		all.Outcomes = append(all.Outcomes, *o)
	}
	for i := range all.Outcomes {
		o := &all.Outcomes[i]
		if o.Refuses() {
			all.Allowed = false
			if all.Refused == nil || o.Result.RetryAfter > all.Refused.Result.RetryAfter {
				all.Refused = o
			}
		}
	}
	f := all.Fields()
	if f.Policy != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: decide.HeaderPolicy, Value: f.Policy},
			&corev3.HeaderValue{Key: decide.HeaderRateLimit, Value: f.RateLimit})
	}
	if f.RetryAfter != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: decide.HeaderRetryAfter, Value: f.RetryAfter})
	}
	return resp, nil
}

// HitFor maps a descriptor to a rule and its key parts (see the package documentation).
func HitFor(d *ratelimitv3.RateLimitDescriptor) (decide.Hit, bool) {
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
func currentLimit(r *config.Rule) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{
		Name:            r.ID,
		RequestsPerUnit: uint32(min(r.Limit.Requests, 1<<32-1)),
		Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
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
		l.UnitMultiplier = wrapperspb.UInt32(uint32(min(secs, 1<<32-1)))
	}
	return l
}
