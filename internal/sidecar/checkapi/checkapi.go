// Package checkapi serves the sidecar's HTTP decision API, POST /v1/check, for gateways and
// applications that want a decision without routing traffic through the proxy.
//
// It listens on loopback unless the pod opts in (contract.AnnotationExposeDecisionAPI).
//
// A request either describes an HTTP request (method, path, headers, remoteAddress), which is
// decided like the proxy decides it, or names rules with their key parts (policy, rule, key, or
// a list of hits), which skips matching. The answer is always 200 with the decision in the body;
// 400 means the request could not be understood, 503 that no policies are loaded.
package checkapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/reqpath"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// Path is where the API is served.
const Path = "/v1/check"

// contentTypeJSON is the type of every answer.
const contentTypeJSON = "application/json"

// Bounds of one check. A request beyond them gets 400 with the bound it broke.
const (
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 64 << 10
	// MaxHits is the most rules one check may name: as many as a policy can have.
	MaxHits = 32
	// MaxKeyParts is the most key parts one hit may give (a rule's key has at most 8).
	MaxKeyParts = 16
	// MaxHeaders is the most header fields a described request may carry.
	MaxHeaders = 64
	// MaxCost is the largest cost a check may ask for: the API's largest limit. A cost above
	// what the rule can ever admit is refused as never admissible (retryAfterSeconds -1).
	MaxCost = 1_000_000_000
)

// Request is the body of POST /v1/check.
type Request struct {
	// Method, Path, Headers and RemoteAddress describe an HTTP request to decide against every
	// matching rule. Header names are case-insensitive; the path may carry a query, which is
	// ignored. The path is as sent on the wire (percent-encoded) and is normalised as the proxy
	// normalises it (package reqpath); one with an encoded slash is refused. X-Forwarded-For
	// in Headers is honoured behind the sidecar's trusted hops.
	// A header's value is a string, or a list of strings for a field the request carries more
	// than once; a name given twice (in any case) is a field carried twice.
	Method        string  `json:"method,omitempty"`
	Path          string  `json:"path,omitempty"`
	Headers       Headers `json:"headers,omitempty"`
	RemoteAddress string  `json:"remoteAddress,omitempty"`
	// Policy, Rule and Key name one rule and its key parts directly.
	Policy string   `json:"policy,omitempty"`
	Rule   string   `json:"rule,omitempty"`
	Key    []string `json:"key,omitempty"`
	// Hits names several rules at once.
	Hits []Hit `json:"hits,omitempty"`
	// Cost is how many units the request takes from each limit (default 1).
	Cost int64 `json:"cost,omitempty"`
	// Reserve, when given, holds for every rule whose cost comes from the response, sized by
	// it, and the answer names the hold to settle (see holds.go). Other rules cost Cost.
	Reserve *Reserve `json:"reserve,omitempty"`
	// Settle ends a hold an earlier check took; nothing else may be given with it.
	Settle *Settle `json:"settle,omitempty"`
	// DryRun answers what the decision would be (allowed, remaining, reset, the refusing rule)
	// and counts nothing: no quota is spent, no lease, hold or slot taken, and no metric or
	// decision log hears of it. Not with Reserve, Settle, Release or Renew.
	DryRun bool `json:"dryRun,omitempty"`
	// Release gives back the slots an earlier check took (see slots.go); nothing else may be
	// given with it.
	Release *SlotRef `json:"release,omitempty"`
	// Renew extends the lease of the slots an earlier check took; nothing else may be given
	// with it.
	Renew *SlotRef `json:"renew,omitempty"`
}

// Hit names one rule and its key parts.
type Hit struct {
	Policy string   `json:"policy"`
	Rule   string   `json:"rule"`
	Key    []string `json:"key"`
}

// Response is the decision.
type Response struct {
	Allowed bool `json:"allowed"`
	// Policy and Rule name the refusing rule when not allowed.
	Policy            string `json:"policy,omitempty"`
	Rule              string `json:"rule,omitempty"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds,omitempty"`
	// Results has one entry per rule that applied.
	Results []Result `json:"results"`
	// Headers are the RateLimit header fields (and Retry-After) to send to the client.
	Headers map[string]string `json:"headers,omitempty"`
	// Candidates has one entry per rule that applied with a candidate limit: what the
	// candidate decided. It never changes allowed.
	Candidates []Result `json:"candidates,omitempty"`
	// Hold is what an admitted reserve holds, to settle by its id.
	Hold *Hold `json:"hold,omitempty"`
	// Settled is what a settle did.
	Settled *Settled `json:"settled,omitempty"`
	// DryRun says the decision was a dry run: nothing was counted.
	DryRun bool `json:"dryRun,omitempty"`
	// Slot is what an admitted check holds of its in-flight rules, to renew and release; and
	// what a renew extended.
	Slot *Slot `json:"slot,omitempty"`
	// Released is what a release gave back.
	Released *Released `json:"released,omitempty"`
}

// Result is one rule's decision.
type Result struct {
	Policy            string `json:"policy"`
	Rule              string `json:"rule"`
	Mode              string `json:"mode"`
	Allowed           bool   `json:"allowed"`
	OverLimit         bool   `json:"overLimit"`
	Limit             int64  `json:"limit"`
	WindowSeconds     int64  `json:"windowSeconds"`
	Remaining         int64  `json:"remaining"`
	ResetSeconds      int64  `json:"resetSeconds"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds,omitempty"`
	Source            string `json:"source"`
	// Unit is "concurrent-requests" for an in-flight rule: Limit is then the most requests of
	// the key in progress at once, Remaining the slots free after the decision, and
	// WindowSeconds and ResetSeconds are 0.
	Unit string `json:"unit,omitempty"`
}

// Handler serves POST /v1/check.
type Handler struct {
	Engine *decide.Engine
	Store  *ruleset.Store
	// Holds keeps the holds of reserves until their settle (nil: reserve and settle are refused).
	Holds *decide.Registry
	// OnUnsized hears of each reserve refused for want of a size (metrics).
	OnUnsized func(rule *ruleset.Rule, reason string)
	// Slots keeps the slots of in-flight rules until their release (nil: a check that takes
	// one is answered 503).
	Slots *decide.SlotRegistry
	// QueueShare bounds the checks waiting in the engine's queue for a slot (slots.go).
	QueueShare *slotqueue.Share
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "use POST")
		return
	}
	req, err := Decode(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			err = fmt.Errorf("check request over %d bytes", MaxBodyBytes)
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case req.Settle != nil:
		h.settle(w, r, req.Settle)
		return
	case req.Release != nil:
		h.release(w, r, req.Release)
		return
	case req.Renew != nil:
		h.renew(w, r, req.Renew)
		return
	}
	set := h.Store.Current()
	if set == nil {
		writeError(w, http.StatusServiceUnavailable, "no policies loaded")
		return
	}
	d, hold, slots, err := h.decideAll(r, set, req)
	if rh, ok := errors.AsType[*decide.RepeatedHeaderError](err); ok {
		// Refused before anything is counted: the request has no one key.
		body, _ := json.Marshal(map[string]string{"error": "repeated_key_header", "header": rh.Header})
		w.Header()["Content-Type"] = []string{contentTypeJSON}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write(append(body, '\n'))
		return
	}
	if re, ok := errors.AsType[*decide.RefusedError](err); ok {
		// No room to keep the hold (it went back): 429 when the key has its share, which it
		// frees by settling its own holds; 503 when the registry is full or the sidecar's
		// memory budget has no room for it.
		status := http.StatusServiceUnavailable
		if errors.Is(re, decide.ErrKeyShareFull) {
			status = http.StatusTooManyRequests
		}
		w.Header()[decide.HeaderRetryAfter] = []string{strconv.FormatInt(max(decide.CeilSeconds(re.RetryAfter), 1), 10)}
		writeError(w, status, err.Error())
		return
	}
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errNoHolds) || errors.Is(err, decide.ErrNoDryRun) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, err.Error())
		return
	}
	var slot *Slot
	if d.Allowed && !slots.Refuses() {
		if slot, err = h.keepSlots(slots); err != nil {
			h.undo(r.Context(), &d, hold, slots)
			refuseNoRoom(w, err)
			return
		}
	}
	resp := render(&d)
	resp.Hold, resp.DryRun = hold, req.DryRun
	resp.Slot = slot
	slotOutcomes(resp, slots, d.Fields()) // and the headers, rules per window's and in-flight's
	writeJSON(w, resp)
}

// decideAll decides a check by its rules per window and its in-flight rules, matched once
// (plan), in the proxy's order: a token budget's request takes its slots first, then its holds;
// any other decides its rules per window first, so a request they refuse takes no slot.
// Whichever refuses, what the other took goes back. slots is nil when none was asked for (a
// plain check allocates none).
func (h *Handler) decideAll(r *http.Request, set *ruleset.Set, req *Request) (d decide.Decision, hold *Hold, slots *decide.Slots, err error) {
	ctx := r.Context()
	plan, err := h.plan(set, req)
	if err != nil {
		return d, nil, nil, err
	}
	if req.DryRun {
		d, err = h.Engine.DryRun(ctx, &plan)
		return d, nil, nil, err
	}
	if req.Reserve != nil {
		if slots = h.Engine.WaitSlots(ctx, &plan, h.QueueShare); slots.Refused != nil {
			return d, nil, slots, nil
		}
		d, hold, err = h.reserve(r, &plan, req)
		if err != nil || !d.Allowed {
			slots.Release(ctx)
		}
		return d, hold, slots, err
	}
	if d = h.Engine.Decide(ctx, &plan); !d.Allowed || !plan.InFlight() {
		return d, nil, nil, nil
	}
	if slots = h.Engine.WaitSlots(ctx, &plan, h.QueueShare); slots.Refused != nil {
		d.GiveBack(ctx)
	}
	return d, nil, slots, nil
}

// plan matches a check once: the rules its hits name, or those its described request meets
// (refused when it repeats a key header), each rule per window at the check's cost. A
// reserve's described request costs one unit in the rules of a known cost, as a proxied one
// does.
func (h *Handler) plan(set *ruleset.Set, req *Request) (decide.Plan, error) {
	hits, dr, err := parse(req)
	if err != nil {
		return decide.Plan{}, err
	}
	cost := max(req.Cost, 1)
	if hits != nil {
		return h.Engine.PlanHits(set, hits, cost)
	}
	if req.Reserve != nil {
		cost = 1
	}
	return h.Engine.Plan(set, dr, cost)
}

// undo gives back all an admitted check took: its slots, its hold and what its rules counted.
func (h *Handler) undo(ctx context.Context, d *decide.Decision, hold *Hold, slots *decide.Slots) {
	slots.Release(ctx)
	if hold != nil && hold.ID != "" {
		if hs := h.Holds.Take(hold.ID); hs != nil {
			_, _ = hs.Settle(ctx, 0, true, false)
		}
	}
	d.GiveBack(ctx)
}

// Decode reads one check request from r: exactly one JSON object with known fields, within
// the bounds above. Its errors say what is wrong, for a 400.
func Decode(r io.Reader) (*Request, error) {
	var req Request
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("decoding check request: %w", err)
	}
	// One object and nothing after it: a second value is a mistake, or a smuggling attempt.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("decoding check request: data after the JSON object")
	}
	if req.Cost < 0 || req.Cost > MaxCost {
		return nil, fmt.Errorf("cost %d: want 1-%d (0 or absent means 1)", req.Cost, MaxCost)
	}
	if len(req.Hits) > MaxHits || (len(req.Hits) == MaxHits && (req.Policy != "" || req.Rule != "")) {
		return nil, fmt.Errorf("%d hits: at most %d rules can be checked at once", len(req.Hits), MaxHits)
	}
	if len(req.Key) > MaxKeyParts {
		return nil, fmt.Errorf("key has %d parts: at most %d", len(req.Key), MaxKeyParts)
	}
	for i, h := range req.Hits {
		if len(h.Key) > MaxKeyParts {
			return nil, fmt.Errorf("hits[%d].key has %d parts: at most %d", i, len(h.Key), MaxKeyParts)
		}
	}
	if n := req.Headers.fields(); n > MaxHeaders {
		return nil, fmt.Errorf("%d headers: at most %d", n, MaxHeaders)
	}
	if err := checkHolds(&req); err != nil {
		return nil, err
	}
	if req.DryRun && (req.Reserve != nil || req.Settle != nil || req.Release != nil || req.Renew != nil) {
		return nil, errors.New("dryRun decides as a plain check: not with reserve, settle, release or renew")
	}
	if err := checkSlotRefs(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// parse reads what a check decides: rule hits, or else a described request.
func parse(req *Request) ([]decide.Hit, *decide.Request, error) {
	hits := make([]decide.Hit, 0, len(req.Hits)+1)
	if req.Policy != "" || req.Rule != "" {
		hits = append(hits, decide.Hit{Policy: req.Policy, Rule: req.Rule, Key: req.Key})
	}
	for _, hit := range req.Hits {
		hits = append(hits, decide.Hit{Policy: hit.Policy, Rule: hit.Rule, Key: hit.Key})
	}
	if len(hits) > 0 {
		if req.Method != "" || req.Path != "" || len(req.Headers) > 0 || req.RemoteAddress != "" {
			return nil, nil, errors.New("give either request attributes or rule hits, not both")
		}
		return hits, nil, nil
	}
	if req.Method == "" || req.Path == "" {
		return nil, nil, errors.New("a check needs method and path, or policy and rule")
	}
	hdr := make(http.Header, len(req.Headers))
	for k, v := range req.Headers {
		if len(v) > 0 {
			hdr[k] = v
		}
	}
	escaped, _, _ := strings.Cut(req.Path, "?")
	// Matched in the normal form the proxy matches and forwards (reqpath): a gateway asking for
	// /./login is counted as /login, which is what the application behind it serves.
	_, path, err := reqpath.Normalize(escaped)
	if err != nil {
		return nil, nil, fmt.Errorf("path %q: %w", req.Path, err)
	}
	return nil, &decide.Request{Method: strings.ToUpper(req.Method), Path: path, Header: hdr, RemoteAddr: req.RemoteAddress}, nil
}

// Headers are the header fields of a described request, by canonical name. In JSON, an object
// of names to a string, or to a list of strings for a field carried more than once; names are
// case-insensitive, and a name given twice, in any case, is one field given twice. (A plain
// map would keep one of two spellings of a name, so a gateway could not say that a field was
// repeated, nor see it refused.)
type Headers map[string][]string

// fields is how many header fields there are.
func (h Headers) fields() int {
	n := 0
	for _, v := range h {
		n += max(len(v), 1)
	}
	return n
}

// UnmarshalJSON reads an object of names to a string or a list of strings, keeping every
// field. At most MaxHeaders fields are read; more is an error.
func (h *Headers) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		*h = nil
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("headers: want an object of names to strings")
	}
	out := Headers{}
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		var vals []string
		if len(raw) > 0 && raw[0] == '[' {
			if err := json.Unmarshal(raw, &vals); err != nil {
				return fmt.Errorf("headers[%q]: want a string or a list of strings", name)
			}
		} else {
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("headers[%q]: want a string or a list of strings", name)
			}
			vals = []string{v}
		}
		if n += max(len(vals), 1); n > MaxHeaders {
			return fmt.Errorf("over %d headers", MaxHeaders)
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		out[k] = append(out[k], vals...)
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	*h = out
	return nil
}

func render(d *decide.Decision) *Response {
	resp := &Response{Allowed: d.Allowed, Results: make([]Result, len(d.Outcomes))}
	if d.Refused != nil {
		resp.Policy, resp.Rule = d.Refused.Rule.Policy.Name, d.Refused.Rule.Name
		resp.RetryAfterSeconds = d.RetryAfterSeconds()
	}
	for i, o := range d.Outcomes {
		resp.Results[i] = result(o)
	}
	for _, o := range d.WaitCandidates() {
		resp.Candidates = append(resp.Candidates, result(o))
	}
	return resp
}

// result renders one outcome; a candidate's mode is Candidate.
func result(o decide.Outcome) Result {
	mode := "Enforce"
	switch {
	case o.Rule.CandidateOf != nil:
		mode = "Candidate"
	case o.Rule.Shadow:
		mode = "Shadow"
	}
	res := Result{
		Policy: o.Rule.Policy.Name, Rule: o.Rule.Name, Mode: mode,
		Allowed: o.Result.Allowed, OverLimit: o.Result.OverLimit,
		Limit: o.Rule.Limit.Requests, WindowSeconds: decide.WindowSeconds(&o),
		Remaining: o.Result.Remaining, ResetSeconds: decide.CeilSeconds(o.Result.ResetAfter),
		Source: o.Result.Source.String(),
	}
	if o.Result.OverLimit {
		res.RetryAfterSeconds = decide.CeilSeconds(o.Result.RetryAfter)
		if o.Result.RetryAfter == time.Duration(-1) {
			res.RetryAfterSeconds = -1
		}
	}
	return res
}

func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(map[string]string{"error": msg})
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
