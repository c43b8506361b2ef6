package checkapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// Token budgets through the decision API: a gateway that sees a request's body and its
// response, but routes around the proxy, reserves before forwarding and settles after.
//
//	POST /v1/check {"method":"POST","path":"/v1/chat/completions","headers":{...},
//	                "reserve":{"prompt":120,"maxOutput":800}}
//	→ {"allowed":true,...,"hold":{"id":"...","units":920,"maxOutput":800,"expiresSeconds":60}}
//	POST /v1/check {"settle":{"hold":"...","used":644}}
//	→ {"allowed":true,"results":[],"settled":{"returned":276,"debt":0,"expired":false}}
//
// The gateway caps the request's output at the hold's maxOutput (the sidecar cannot: it never
// sees this request). A hold never settled stays spent when it expires; one settled late (up to
// a minute past) settles as a timely one would.

// Reserve sizes a hold. With neither field the request is unsized: a rule with
// cost.unsizedBody Refuse refuses it (400), any other holds its defaultHold.
type Reserve struct {
	// Prompt is the estimate of the request's input, in the limit's units.
	Prompt int64 `json:"prompt,omitempty"`
	// MaxOutput is the output cap the client asked for (0: none).
	MaxOutput int64 `json:"maxOutput,omitempty"`
}

// Settle ends a hold.
type Settle struct {
	// Hold is the id a reserve answered.
	Hold string `json:"hold"`
	// Used is what the request cost; absent when unknown, which settles by the rule's onError
	// when Failed, else at the whole hold.
	Used *int64 `json:"used,omitempty"`
	// Failed says the request failed (upstream error, timeout, client abort).
	Failed bool `json:"failed,omitempty"`
}

// Hold is what a reserve holds.
type Hold struct {
	// ID names the hold to settle; absent when no rule holds (no rule whose cost comes from
	// the response matched).
	ID string `json:"id,omitempty"`
	// Units is the most the request may cost: the smallest hold of an Enforce rule (0 when
	// only Shadow rules hold).
	Units int64 `json:"units"`
	// MaxOutput is the output cap the request fits in: Units less the prompt (absent when
	// no Enforce rule caps it).
	MaxOutput int64 `json:"maxOutput,omitempty"`
	// ExpiresSeconds is how long the hold waits for its settle, rounded down.
	ExpiresSeconds int64 `json:"expiresSeconds"`
}

// Settled is what a settle did, summed over the rules that held.
type Settled struct {
	// Returned is what went back (the request used less than held).
	Returned int64 `json:"returned"`
	// Debt is what was charged beyond the hold: the key is refused until it is repaid.
	Debt int64 `json:"debt"`
	// Expired says the hold's deadline had passed before the settle.
	Expired bool `json:"expired"`
}

// holdIDBytes bounds a hold id (22 characters are given out).
const holdIDBytes = 64

// errNoHolds is answered 503 by a sidecar without a registry.
var errNoHolds = errors.New("this sidecar keeps no holds")

// checkHolds checks reserve and settle in a decoded request.
func checkHolds(req *Request) error {
	if s := req.Settle; s != nil {
		if req.Reserve != nil || req.Release != nil || req.Renew != nil || req.Policy != "" || req.Rule != "" || len(req.Key) > 0 || len(req.Hits) > 0 ||
			req.Method != "" || req.Path != "" || len(req.Headers) > 0 || req.RemoteAddress != "" || req.Cost != 0 {
			return errors.New("a settle names its hold and nothing else")
		}
		if s.Hold == "" || len(s.Hold) > holdIDBytes {
			return fmt.Errorf("settle.hold: want the id a reserve answered (at most %d bytes)", holdIDBytes)
		}
		if s.Used != nil && (*s.Used < 0 || *s.Used > MaxCost) {
			return fmt.Errorf("settle.used %d: want 0-%d", *s.Used, MaxCost)
		}
	}
	if r := req.Reserve; r != nil {
		if r.Prompt < 0 || r.Prompt > MaxCost || r.MaxOutput < 0 || r.MaxOutput > MaxCost {
			return fmt.Errorf("reserve prompt %d, maxOutput %d: want 0-%d each", r.Prompt, r.MaxOutput, MaxCost)
		}
	}
	return nil
}

func (h *Handler) reserve(r *http.Request, plan *decide.Plan, req *Request) (decide.Decision, *Hold, error) {
	if h.Holds == nil {
		return decide.Decision{}, nil, errNoHolds
	}
	need := decide.Need{Sized: req.Reserve.Prompt > 0 || req.Reserve.MaxOutput > 0, Prompt: req.Reserve.Prompt, Output: req.Reserve.MaxOutput}
	if !need.Sized {
		if rule := plan.RefusesUnsized(); rule != nil {
			if h.OnUnsized != nil {
				h.OnUnsized(rule, ReasonReserveWithoutSize)
			}
			return decide.Decision{}, nil, fmt.Errorf("reserve without a size: rule %s/%s refuses requests it cannot size (cost.unsizedBody: Refuse); send reserve.prompt (and reserve.maxOutput, 0 for none), or set unsizedBody: Hold", rule.Policy.Name, rule.Name)
		}
	}
	d, hs, err := h.Engine.Reserve(r.Context(), plan, need)
	if err != nil || hs == nil {
		return d, nil, err
	}
	units, capped := hs.Afford()
	hold := &Hold{Units: units, ExpiresSeconds: int64(time.Until(hs.Deadline()) / time.Second)}
	if capped && need.Sized {
		hold.MaxOutput = max(units-need.Prompt, 0)
	}
	if hs.Len() == 0 {
		return d, hold, nil
	}
	hold.ID, err = h.Holds.Put(hs, "", hs.Deadline())
	if err != nil {
		// Nobody could settle it: give it back now, and what the other rules counted.
		_, _ = hs.Settle(r.Context(), 0, true, false)
		d.GiveBack(r.Context())
		return decide.Decision{}, nil, err
	}
	return d, hold, nil
}

// ReasonReserveWithoutSize is the reason a reserve without a size is refused, in the metric.
const ReasonReserveWithoutSize = "reserve_without_size"

func (h *Handler) settle(w http.ResponseWriter, r *http.Request, s *Settle) {
	if h.Holds == nil {
		writeError(w, http.StatusServiceUnavailable, errNoHolds.Error())
		return
	}
	hs := h.Holds.Take(s.Hold)
	if hs == nil {
		writeError(w, http.StatusNotFound, "no such hold: settled already, or expired over a minute ago")
		return
	}
	var used int64
	if s.Used != nil {
		used = *s.Used
	}
	got, err := hs.Settle(r.Context(), used, s.Used != nil, s.Failed)
	if err != nil {
		// The hold stays spent past its deadline; what was used beyond it is lost.
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("settling: %v", err))
		return
	}
	body, _ := json.Marshal(&Response{Allowed: true, Results: []Result{}, Settled: &Settled{Returned: got.Returned, Debt: got.Debt, Expired: got.Expired}})
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	_, _ = w.Write(append(body, '\n'))
}
