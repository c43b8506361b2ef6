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
//
// The service is gRPC, served over cleartext HTTP/2 by a small server of its own (HTTPServer;
// net/http's flushes each answer in three writes) with a hand-written codec for the few message
// fields it uses: grpc-go, go-control-plane and the protobuf runtime they bring would cost the
// sidecar about 6 MiB of resident memory. It also answers grpc.health.v1.Health/Check.
package rls

import (
	"context"
	"errors"
	"strings"

	"github.com/redline-dev/redline/internal/sidecar/config"
	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// Descriptor entry keys that select a rule.
const (
	EntryPolicy     = "policy"
	EntryRule       = "rule"
	EntryGenericKey = "generic_key"
)

// Server is the rate limit service; as an http.Handler it serves it over gRPC.
type Server struct {
	Engine *decide.Engine
	Store  *config.Store
}

// ShouldRateLimit decides every descriptor; the request is over limit when any Enforce rule
// refuses. Its errors are gRPC statuses: Unavailable without policies, InvalidArgument without
// descriptors.
func (s *Server) ShouldRateLimit(ctx context.Context, req *Request) (*Response, error) {
	set := s.Store.Current()
	if set == nil {
		return nil, statusError(codeUnavailable, "no policies loaded")
	}
	if len(req.Descriptors) == 0 {
		return nil, statusError(codeInvalidArgument, "no descriptors")
	}
	resp := &Response{OverallCode: CodeOK, Statuses: make([]DescriptorStatus, len(req.Descriptors))}
	all := decide.Decision{Allowed: true}
	for i := range req.Descriptors {
		desc := &req.Descriptors[i]
		st := &resp.Statuses[i]
		st.Code = CodeOK
		hit, ok := HitFor(desc)
		if !ok || desc.IsNegativeHits || set.Find(hit.Policy, hit.Rule) == nil {
			continue
		}
		cost := int64(req.HitsAddend)
		if desc.HitsAddend != nil {
			cost = int64(*desc.HitsAddend)
		}
		cost = max(cost, 1)
		d, err := s.Engine.DecideHits(ctx, set, []decide.Hit{hit}, cost)
		if err != nil {
			if errors.Is(err, decide.ErrUnknownRule) {
				continue
			}
			return nil, statusError(codeInternal, "deciding "+hit.Policy+"/"+hit.Rule+": "+err.Error())
		}
		o := &d.Outcomes[0]
		st.CurrentLimit = currentLimit(o.Rule)
		st.LimitRemaining = uint32(min(max(o.Result.Remaining, 0), 1<<32-1))
		st.DurationUntilReset = new(o.Result.ResetAfter)
		if o.Refuses() {
			st.Code = CodeOverLimit
			resp.OverallCode = CodeOverLimit
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
			HeaderValue{Key: decide.HeaderPolicy, Value: f.Policy},
			HeaderValue{Key: decide.HeaderRateLimit, Value: f.RateLimit})
	}
	if f.RetryAfter != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, HeaderValue{Key: decide.HeaderRetryAfter, Value: f.RetryAfter})
	}
	return resp, nil
}

// HitFor maps a descriptor to a rule and its key parts (see the package documentation).
func HitFor(d *Descriptor) (decide.Hit, bool) {
	var h decide.Hit
	generic := -1
	entries := d.Entries
	for i, e := range entries {
		switch e.Key {
		case EntryPolicy:
			h.Policy = e.Value
		case EntryRule:
			h.Rule = e.Value
		case EntryGenericKey:
			if generic < 0 && strings.Contains(e.Value, "/") {
				generic = i
			}
		}
	}
	skip := -1
	if h.Policy == "" || h.Rule == "" {
		if generic < 0 {
			return decide.Hit{}, false
		}
		h.Policy, h.Rule, _ = strings.Cut(entries[generic].Value, "/")
		skip = generic
	}
	for i, e := range entries {
		if i == skip || (skip < 0 && (e.Key == EntryPolicy || e.Key == EntryRule)) {
			continue
		}
		h.Key = append(h.Key, e.Value)
	}
	return h, h.Policy != "" && h.Rule != ""
}

// currentLimit expresses a rule's window in the largest unit that divides it.
func currentLimit(r *config.Rule) *RateLimit {
	l := &RateLimit{
		Name:            r.ID,
		RequestsPerUnit: uint32(min(r.Limit.Requests, 1<<32-1)),
		Unit:            UnitSecond,
	}
	secs := r.WindowSeconds
	for _, u := range []struct {
		unit Unit
		secs int64
	}{{UnitDay, 86400}, {UnitHour, 3600}, {UnitMinute, 60}} {
		if secs >= u.secs && secs%u.secs == 0 {
			l.Unit, secs = u.unit, secs/u.secs
			break
		}
	}
	if secs != 1 {
		l.UnitMultiplier = new(uint32(min(secs, 1<<32-1)))
	}
	return l
}
