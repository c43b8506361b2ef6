package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// In-flight limits: a request that matches an in-flight rule holds a slot of its key from its
// decision until the proxy is done with it. ReverseProxy.ServeHTTP returns once the response
// ended whichever way: its body fully written or a stream's end, an upgraded connection closed
// both ways, an upstream error answered, the client gone, a timeout; the slot goes back then
// (one ZREM). A request refused by a slot gets nothing counted: a limit per window on the same
// request gives back what it counted, as for any refusal after the rules (decide's give-back).
//
// The limits per window decide first, then the slots: a request the window refuses never
// takes a slot, so a flood of refused requests cannot crowd the admitted ones out of their
// slots. A token budget's request takes its slots first instead, since its holds are reserved
// and settled inside serveBudget; a refusal there gives the slots back at once.
//
// A slot lost before its request ends (not renewed in time, or gone from Redis) cancels the
// request's context: ReverseProxy stops forwarding and cuts the response, since another
// request may hold its place. A rule with onSlotLost: Finish lets the request run on instead,
// no longer counted: its key may then have more than its limit in progress until it ends.

// takeSlots takes the slots of plan's in-flight rules, or answers the refusal (giving back what d counted, when
// d is not nil) and returns nil.
func (h *Handler) takeSlots(w http.ResponseWriter, r *http.Request, plan *decide.Plan, d *decide.Decision) *decide.Slots {
	slots := h.opts.Engine.WaitSlots(r.Context(), plan, h.opts.QueueShare)
	if slots.Refused == nil {
		return slots
	}
	f := decide.Fields{}
	if d != nil {
		d.GiveBack(r.Context())
		f = d.Fields()
		f.RetryAfter = ""
	}
	slots.WriteFields(&f)
	f.Write(w.Header())
	if isGRPC(r) {
		writeGRPCStatus(w, codes.ResourceExhausted, "too many requests in progress for policy "+slots.Refused.Rule.Policy.Name+
			" rule "+slots.Refused.Rule.Name+"; retry after "+f.RetryAfter+"s")
		return nil
	}
	body, _ := json.Marshal(Refusal{
		Error:             "too_many_in_flight",
		Policy:            slots.Refused.Rule.Policy.Name,
		Rule:              slots.Refused.Rule.Name,
		RetryAfterSeconds: max(decide.CeilSeconds(slots.Refused.Result.RetryAfter), 1),
	})
	body = append(body, '\n')
	hdr := w.Header()
	hdr["Content-Type"] = []string{contentTypeJSON}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Cache-Control"] = []string{noStore}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	return nil
}

// endOnLost returns r with a context cancelled when one of the request's slots is lost (of a
// rule that ends its requests then), and the function that lets go of the watch (call it when
// the request is done).
func endOnLost(r *http.Request, slots *decide.Slots) (*http.Request, context.CancelFunc) {
	if slots.Held() == 0 {
		return r, func() {}
	}
	ctx, cancel := context.WithCancel(r.Context())
	slots.WatchLost(ctx, cancel)
	return r.WithContext(ctx), cancel
}
