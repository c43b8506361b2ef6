package checkapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/decide"
)

// In-flight limits through the decision API: a check that matches in-flight rules (a described
// request, or hits naming them) takes a slot of each, and the answer names them by one id. The
// gateway releases it when the response ends, and renews it while the response runs:
//
//	POST /v1/check {"method":"POST","path":"/v1/generate","headers":{"X-Key":"a"}}
//	→ {"allowed":true,...,"slot":{"id":"...","held":1,"expiresSeconds":10}}
//	POST /v1/check {"renew":{"slot":"..."}}       (before expiresSeconds, every few seconds)
//	→ {"allowed":true,"results":[],"slot":{"id":"...","held":1,"expiresSeconds":10}}
//	POST /v1/check {"release":{"slot":"..."}}
//	→ {"allowed":true,"results":[],"released":{"slots":1}}
//
// A check of a rule with limit.queue whose key is full waits for a slot before it is answered,
// in the sidecar's one queue (the proxy's requests of the key wait in the same line, first
// come first served), up to the rule's timeout, as a proxied request does: the rules per
// window decide first, and a check they refuse never waits. Each waiting check holds one of
// the face's connections, so at most half of --max-check-conns wait (Handler.QueueShare),
// beside the rule's size per key, --in-flight-queue-max and the memory budget; a check that
// finds no room is answered at once, refused. A client that goes away leaves the queue.
//
// A slot not renewed within its lease (the flag --in-flight-expiry) is released by the sidecar:
// a gateway that crashed frees its slots within a lease and a second. A renew that finds the
// slot lost (410) means another request may hold its place: end the request.

// SlotRef names a slot an earlier check took.
type SlotRef struct {
	// Slot is the id the check answered.
	Slot string `json:"slot"`
}

// Slot is what an admitted check holds of its in-flight rules, to renew and release by its id.
type Slot struct {
	ID string `json:"id"`
	// Held is how many slots the id holds (one per matching in-flight rule, Shadow ones with
	// room included).
	Held int `json:"held"`
	// ExpiresSeconds is how long the slot counts without a renew, rounded down.
	ExpiresSeconds int64 `json:"expiresSeconds"`
}

// Released is what a release gave back.
type Released struct {
	Slots int `json:"slots"`
}

// UnitConcurrentRequests is Result.Unit of an in-flight rule: the RateLimit fields draft's
// quota unit.
const UnitConcurrentRequests = "concurrent-requests"

var errNoSlotRegistry = errors.New("this sidecar keeps no in-flight slots for the decision API")

// checkSlotRefs checks release and renew in a decoded request: each names its slot and nothing
// else comes with it.
func checkSlotRefs(req *Request) error {
	for name, ref := range map[string]*SlotRef{"release": req.Release, "renew": req.Renew} {
		if ref == nil {
			continue
		}
		if req.Release != nil && req.Renew != nil || req.Settle != nil || req.Reserve != nil || req.Policy != "" || req.Rule != "" ||
			len(req.Key) > 0 || len(req.Hits) > 0 || req.Method != "" || req.Path != "" || len(req.Headers) > 0 || req.RemoteAddress != "" || req.Cost != 0 {
			return fmt.Errorf("a %s names its slot and nothing else", name)
		}
		if ref.Slot == "" || len(ref.Slot) > holdIDBytes {
			return fmt.Errorf("%s.slot: want the id a check answered (at most %d bytes)", name, holdIDBytes)
		}
	}
	return nil
}

// keepSlots keeps what slots hold under a new id for the client to renew and release. When
// there is no room for it, the slots go back and the error says why.
func (h *Handler) keepSlots(slots *decide.Slots) (*Slot, error) {
	if slots.Held() == 0 {
		return nil, nil
	}
	if h.Slots == nil {
		return nil, errNoSlotRegistry
	}
	held := slots.Held()
	id, deadline, err := h.Slots.Put(slots, "")
	if err != nil {
		return nil, err
	}
	return &Slot{ID: id, Held: held, ExpiresSeconds: int64(time.Until(deadline) / time.Second)}, nil
}

// slotOutcomes adds the in-flight rules' results to resp, and when they refused, makes resp the
// refusal (with what the rules per window said of the request in fields); then it sets resp's
// headers from fields and the in-flight rules' own, once per check (render leaves them out).
func slotOutcomes(resp *Response, slots *decide.Slots, f decide.Fields) {
	if slots == nil {
		resp.Headers = headersOf(f)
		return
	}
	for _, o := range slots.Outcomes {
		mode := "Enforce"
		if o.Rule.Shadow {
			mode = "Shadow"
		}
		free := int64(0)
		if !o.Result.Full {
			free = max(o.Rule.InFlight.Max-o.Result.InUse, 0)
		}
		res := Result{Policy: o.Rule.Policy.Name, Rule: o.Rule.Name, Mode: mode, Allowed: o.Result.Allowed, OverLimit: o.Result.Full,
			Limit: o.Rule.InFlight.Max, Remaining: free, Source: "Redis", Unit: UnitConcurrentRequests}
		if o.Result.Err != nil {
			res.Source = "FailureMode"
		}
		if o.Result.Full {
			res.RetryAfterSeconds = max(decide.CeilSeconds(o.Result.RetryAfter), 1)
		}
		resp.Results = append(resp.Results, res)
	}
	if slots.Refused != nil {
		resp.Allowed = false
		resp.Policy, resp.Rule = slots.Refused.Rule.Policy.Name, slots.Refused.Rule.Name
		resp.RetryAfterSeconds = max(decide.CeilSeconds(slots.Refused.Result.RetryAfter), 1)
		f.RetryAfter = ""
	}
	slots.WriteFields(&f)
	resp.Headers = headersOf(f)
}

// headersOf is f as the answer's headers (nil when there are none).
func headersOf(f decide.Fields) map[string]string {
	if f.Policy == "" && f.RetryAfter == "" {
		return nil
	}
	out := map[string]string{}
	if f.Policy != "" {
		out[decide.HeaderPolicy] = f.Policy
		out[decide.HeaderRateLimit] = f.RateLimit
	}
	if f.RetryAfter != "" {
		out[decide.HeaderRetryAfter] = f.RetryAfter
	}
	return out
}

// refuseNoRoom answers a check whose slots had no room in the registry (they went back): 503
// with Retry-After.
func refuseNoRoom(w http.ResponseWriter, err error) {
	retry := int64(1)
	if re, ok := errors.AsType[*decide.RefusedError](err); ok {
		retry = max(decide.CeilSeconds(re.RetryAfter), 1)
	}
	w.Header()[decide.HeaderRetryAfter] = []string{strconv.FormatInt(retry, 10)}
	writeError(w, http.StatusServiceUnavailable, err.Error())
}

func (h *Handler) release(w http.ResponseWriter, r *http.Request, ref *SlotRef) {
	if h.Slots == nil {
		writeError(w, http.StatusServiceUnavailable, errNoSlotRegistry.Error())
		return
	}
	slots := h.Slots.Take(ref.Slot)
	if slots == nil {
		writeError(w, http.StatusNotFound, decide.ErrNoSuchSlot.Error())
		return
	}
	n := slots.Held()
	slots.Release(r.Context())
	writeJSON(w, &Response{Allowed: true, Results: []Result{}, Released: &Released{Slots: n}})
}

func (h *Handler) renew(w http.ResponseWriter, r *http.Request, ref *SlotRef) {
	if h.Slots == nil {
		writeError(w, http.StatusServiceUnavailable, errNoSlotRegistry.Error())
		return
	}
	held, deadline, err := h.Slots.Renew(r.Context(), ref.Slot)
	switch {
	case errors.Is(err, decide.ErrNoSuchSlot):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusGone, err.Error())
		return
	}
	writeJSON(w, &Response{Allowed: true, Results: []Result{}, Slot: &Slot{ID: ref.Slot, Held: held, ExpiresSeconds: int64(time.Until(deadline) / time.Second)}})
}

func writeJSON(w http.ResponseWriter, resp *Response) {
	body, err := json.Marshal(resp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("encoding decision: %v", err))
		return
	}
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	_, _ = w.Write(append(body, '\n'))
}
