package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/meter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/tokens"
)

// Token budgets: a request some rule of which takes its cost from the response (ruleset.Cost)
// is sized from its body, holds what it may spend before it is sent, has its output cap
// lowered to what the hold affords, and settles with the usage its response reports.
//
//  1. The body is read for sizing within bounds (tokens.MaxRequestBytes, Options.BodyReadTimeout).
//     A request that cannot be sized (a path whose API is not read, a compressed body, one over
//     the bounds, not JSON, not of its API's shape, a count not understood) is refused with a
//     4xx naming why when an Enforce rule it matches says so (ruleset.Cost.RefuseUnsized);
//     otherwise it holds the rule's defaultHold and goes to the application untouched.
//  2. decide.Engine.Reserve holds between the prompt and the rule's minOutput (refused below
//     it, 429 like any refusal) and the prompt and the client's cap (or all the budget has).
//  3. The output cap is set to what the smallest hold affords less the prompt, per choice; an
//     OpenAI chat stream that did not ask for its usage is asked, and the extra chunk removed
//     before the client (meter.Options.StripUsage).
//  4. The response passes through unbuffered while its usage is scanned (meter.Wrap); its end
//     settles the holds: the usage when reported, else by the rule's onError when the response
//     failed, else the whole hold. A response that never came (the application down) settles
//     as failed when the proxy is done with it.

// DefaultBodyReadTimeout bounds the read of a request body for sizing.
const DefaultBodyReadTimeout = 5 * time.Second

// workFactor is how many times a body's size sizing it and rewriting its cap allocate
// (measured on 1 MiB bodies: tokens.ScanRequest 2 times, tokens.SetOutputCap, which scans it
// again, 5 times), drawn from the memory budget beside the body's own buffer.
const workFactor = 5

// budgetKey is the context key of a request's *budget.
type budgetKey struct{}

// budget is one request's holds on their way to their settle.
type budget struct {
	holds  *decide.Holds
	kind   tokens.Kind
	prompt int64 // the prompt's estimate, 0 when unsized
	strip  bool
	cost   *ruleset.Cost
	once   sync.Once
	wg     sync.WaitGroup
}

// settle ends the holds once, off the goroutine that calls it: the meter calls it on the
// proxy's copy loop, which should not wait for Redis.
func (b *budget) settle(ctx context.Context, used int64, known, failed bool) {
	b.once.Do(func() {
		b.wg.Go(func() { _, _ = b.holds.Settle(ctx, used, known, failed) })
	})
}

// Why a request cannot be sized: the reason label of the refusals' metric, and the refusal's
// "reason" field.
const (
	UnsizedPath       = "unknown_api_path"
	UnsizedCompressed = "body_compressed"
	UnsizedTooLarge   = "body_too_large"
	UnsizedSlow       = "body_too_slow"
	UnsizedUnreadable = "body_unreadable"
	UnsizedNotJSON    = "body_not_json"
	UnsizedShape      = "body_not_of_api_shape"
	UnsizedNumber     = "number_not_understood"
	UnsizedNotPriced  = "input_not_priced"
)

// unsizedStatus is the status and message a refusal of each reason answers with.
var unsizedStatus = map[string]struct {
	status int
	msg    string
}{
	UnsizedPath:       {http.StatusBadRequest, "the token budget cannot size a request to this path: its API is not one the sidecar reads"},
	UnsizedCompressed: {http.StatusUnsupportedMediaType, "the token budget cannot size a compressed request body: send it uncompressed"},
	UnsizedTooLarge:   {http.StatusRequestEntityTooLarge, "the token budget cannot size a request body over 1 MiB"},
	UnsizedSlow:       {http.StatusRequestTimeout, "the request body did not arrive within the time for sizing it"},
	UnsizedUnreadable: {http.StatusBadRequest, "the request body could not be read"},
	UnsizedNotJSON:    {http.StatusBadRequest, "the request body is not JSON (or is nested too deep)"},
	UnsizedShape:      {http.StatusBadRequest, "the request body is not of the shape of the API its path names"},
	UnsizedNotPriced:  {http.StatusBadRequest, "the request has an input the token budget cannot price from the request (a file, a document, audio or video, or context the upstream keeps): send its content as text or images"},
	UnsizedNumber:     {http.StatusBadRequest, "an output cap, choice count or stream flag of the request body is in a form the token budget does not read (a fraction, a negative other than -1, true, or text)"},
}

// UnsizedRefusal is the body of a refusal of a request that cannot be sized.
type UnsizedRefusal struct {
	Error   string `json:"error"` // "unsized_body"
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Policy  string `json:"policy"`
	Rule    string `json:"rule"`
	Detail  string `json:"detail,omitempty"`
}

// sizeBody reads and sizes a request's body, drawing the buffer and the work of sizing it
// from lease; reason is why it cannot be sized ("" when it was), detail the error behind it
// (meter.ErrNoMemory, with no reason, when the memory budget has no room). A body read but
// not understood is returned too, with its reason: it is what goes upstream under Hold.
func (h *Handler) sizeBody(r *http.Request, c *ruleset.Cost, kind tokens.Kind, pathStream bool, lease *membudget.Lease) (body []byte, sized tokens.Request, reason string, detail error) {
	if kind == tokens.Unknown {
		if c.ReadsBody() {
			return nil, sized, UnsizedPath, nil
		}
		return nil, sized, "", nil // usage Header: sized by design, at defaultHold
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil, sized, UnsizedCompressed, nil
	}
	// Sizing the body and rewriting its cap allocate up to workFactor times it, for a moment:
	// drawn before the body is read when its length is declared (a request that does not fit
	// allocates nothing), else once it is read, and kept until the body left for the upstream
	// is known (serveBudget shrinks the draw then).
	work := int64(0)
	if cl := r.ContentLength; cl > 0 && cl <= tokens.MaxRequestBytes {
		work = workFactor * cl
	}
	if !lease.Grow(work) {
		return nil, sized, "", meter.ErrNoMemory
	}
	b, err := meter.ReadBodyIn(r, tokens.MaxRequestBytes, h.opts.BodyReadTimeout, lease)
	if err == nil && !lease.Grow(workFactor*int64(len(b))-work) {
		err = meter.ErrNoMemory
	}
	if errors.Is(err, meter.ErrNoMemory) {
		return nil, sized, "", err
	}
	if err != nil {
		lease.Shrink(work) // not sized: only the buffer, if any, is left to hand on
	}
	switch {
	case errors.Is(err, meter.ErrBodyTooLarge):
		return nil, sized, UnsizedTooLarge, err
	case errors.Is(err, meter.ErrBodySlow):
		return nil, sized, UnsizedSlow, err
	case err != nil:
		return nil, sized, UnsizedUnreadable, err
	}
	tr, err := tokens.ScanRequest(b, kind, pathStream)
	switch {
	case err == nil:
		return b, tr, "", nil
	case errors.Is(err, tokens.ErrTooLarge):
		return b, sized, UnsizedTooLarge, err
	case errors.Is(err, tokens.ErrNumber):
		return b, sized, UnsizedNumber, err
	case errors.Is(err, tokens.ErrNotPriced):
		return b, sized, UnsizedNotPriced, err
	case errors.Is(err, tokens.ErrNotJSON), errors.Is(err, tokens.ErrTooDeep):
		return b, sized, UnsizedNotJSON, err
	}
	return b, sized, UnsizedShape, err
}

// refuseUnsized answers a request that cannot be sized under rule, which refuses it.
func (h *Handler) refuseUnsized(w http.ResponseWriter, rule *ruleset.Rule, reason string, detail error) {
	if h.opts.OnUnsized != nil {
		h.opts.OnUnsized(rule, reason)
	}
	st := unsizedStatus[reason]
	ref := UnsizedRefusal{Error: "unsized_body", Reason: reason, Message: st.msg, Policy: rule.Policy.Name, Rule: rule.Name}
	if detail != nil {
		ref.Detail = detail.Error()
	}
	body, _ := json.Marshal(&ref)
	body = append(body, '\n')
	hdr := w.Header()
	hdr["Content-Type"] = []string{contentTypeJSON}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Cache-Control"] = []string{noStore}
	// the body may be partly read: the connection is not reused
	hdr["Connection"] = []string{"close"}
	w.WriteHeader(st.status)
	_, _ = w.Write(body)
}

// serveBudget decides, holds, forwards and settles a request of a token budget.
func (h *Handler) serveBudget(w http.ResponseWriter, r *http.Request, set *ruleset.Set, plan *decide.Plan) {
	c := plan.Costed().Cost
	kind, pathStream := c.KindFor(r.URL.Path)
	plain, costed := plan.Split()
	// Rules of a known cost are decided before the body is read: a request they refuse is
	// never buffered. They are not decided again with the holds (costed has none of them).
	pd := h.opts.Engine.Decide(r.Context(), &plain)
	if !pd.Allowed {
		refuse(w, &pd)
		return
	}
	// The body's buffer, and the work of sizing it, draw from the memory budget; what is left
	// of the draw goes back when the body has gone upstream (or at the latest here).
	lease, _ := h.opts.Memory.Take(0)
	defer lease.Release()
	need := decide.Need{}
	kept := int64(-1) // the bytes of the body left for the upstream, when known
	body, sized, reason, detail := h.sizeBody(r, c, kind, pathStream, lease)
	if errors.Is(detail, meter.ErrNoMemory) {
		pd.GiveBack(r.Context()) // refused: it counts in no rule
		noMemory(w)
		return
	}
	if body != nil {
		kept = int64(cap(body))
	}
	if reason != "" {
		if rule := plan.RefusesUnsized(); rule != nil {
			pd.GiveBack(r.Context())
			h.refuseUnsized(w, rule, reason, detail)
			return
		}
		body = nil
	} else if body != nil {
		need = decide.Need{Sized: true, Prompt: sized.PromptTokens, Output: sized.MaxOutput()}
		if !sized.HasOutput() {
			need.Output = 1 // embeddings: the prompt is the cost; the least hold is prompt + minOutput
		}
	}
	// The holds the request keeps until its settle draw from the memory budget too: one for
	// each rule that may hold, down to those that did once the reserve has answered.
	held, ok := h.opts.Memory.Take(decide.HoldBytes * int64(costed.MostHolds()))
	if !ok {
		noMemory(w)
		return
	}
	defer held.Release()
	d, hs, err := h.opts.Engine.Reserve(r.Context(), &costed, need)
	held.ShrinkTo(decide.HoldBytes * int64(hs.Len()))
	if err != nil {
		pd.GiveBack(r.Context())
		h.opts.Log.Error("holding for a token budget", "error", err)
		writeJSONError(w, http.StatusServiceUnavailable, "token_budget_unavailable")
		return
	}
	d.Outcomes = inRuleOrder(set, pd.Outcomes, d.Outcomes)
	if !d.Allowed {
		pd.GiveBack(r.Context()) // the holds went back already
		refuse(w, &d)
		return
	}
	if h.opts.Headers {
		d.Fields().Write(w.Header())
	}
	b := &budget{holds: hs, kind: kind, cost: c, prompt: need.Prompt}
	if body != nil && sized.HasOutput() {
		nb, asked := h.capOutput(body, kind, sized, hs)
		if nb != nil {
			r.Body = meter.HeldBody(nb, lease)
			r.ContentLength = int64(len(nb))
			r.Header["Content-Length"] = []string{strconv.Itoa(len(nb))}
			r.TransferEncoding = nil
			kept = int64(cap(nb))
		}
		b.strip = asked
	}
	if kept >= 0 {
		lease.ShrinkTo(kept) // the work on the body is done
	}
	// A compressed answer cannot be scanned for its usage: ask for none.
	r.Header.Del("Accept-Encoding")
	ctx := r.Context()
	r = r.WithContext(context.WithValue(ctx, budgetKey{}, b))
	h.forward(w, r)
	// The meter settled at the response's end; a response that never came settles here.
	b.settle(ctx, 0, false, true)
	b.wg.Wait()
}

// noMemory answers a request the memory budget has no room for: 503, to be tried again.
func noMemory(w http.ResponseWriter) {
	w.Header()[decide.HeaderRetryAfter] = []string{"1"}
	writeJSONError(w, http.StatusServiceUnavailable, "memory_budget_full")
}

// inRuleOrder merges the outcomes of the two decisions of one request in the order of their
// rules in set, as one decision of both would list them (the header fields' order).
func inRuleOrder(set *ruleset.Set, a, b []decide.Outcome) []decide.Outcome {
	if len(a) == 0 {
		return b
	}
	all := make([]decide.Outcome, 0, len(a)+len(b))
	i, j := 0, 0
	for _, r := range set.Rules {
		switch {
		case i < len(a) && a[i].Rule == r:
			all = append(all, a[i])
			i++
		case j < len(b) && b[j].Rule == r:
			all = append(all, b[j])
			j++
		}
	}
	return append(append(all, a[i:]...), b[j:]...)
}

// capOutput lowers the request's output cap to what its holds afford, per choice, and asks an
// OpenAI chat stream for its usage when the client did not; it reports whether it asked (the
// usage chunk is then removed from the response). The body is rewritten only when needed: nb
// is the new body, nil when the request goes as sent.
func (h *Handler) capOutput(body []byte, kind tokens.Kind, sized tokens.Request, hs *decide.Holds) (nb []byte, asked bool) {
	limit, lowered := sized.OutputCap, false // 0: none
	if units, capped := hs.Afford(); capped {
		per := max(units-sized.PromptTokens, 0) / max(sized.Choices, 1)
		if limit == 0 || per < limit {
			limit, lowered = per, true
		}
	}
	ask := (kind == tokens.OpenAIChat || kind == tokens.OpenAICompletions) && sized.Stream && !sized.IncludeUsage
	if !lowered && (!ask || limit == 0) {
		// Nothing to change; or only the usage to ask for, of a request that no Enforce rule
		// caps and that set no cap itself, which SetOutputCap cannot leave uncapped: it goes
		// as sent, and its settle has no usage (the whole hold, of Shadow rules only).
		return nil, false
	}
	nb, err := tokens.SetOutputCap(body, kind, limit, ask)
	if err != nil {
		h.opts.Log.Warn("setting the output cap of a token budget's request", "error", err)
		return nil, false
	}
	return nb, ask
}

// meterResponse wraps the response of a token budget's request (ReverseProxy.ModifyResponse).
func meterResponse(res *http.Response) error {
	b, ok := res.Request.Context().Value(budgetKey{}).(*budget)
	if !ok {
		return nil
	}
	ctx := res.Request.Context()
	status := res.StatusCode
	meter.Wrap(res, meter.Options{Kind: b.kind, StripUsage: b.strip, CostHeader: b.cost.Header, OnEnd: func(o meter.Outcome) {
		used, known := b.charge(o)
		b.settle(ctx, used, known, !o.Complete || status >= http.StatusBadRequest)
	}})
	return nil
}

// charge is what a response settles with. A usage the application or the upstream reported
// for a whole response counts as it is. A response that reported none, or was cut after a
// partial report (an Anthropic stream's message_start), is charged at least what passed
// through it: the input (reported, else the prompt's estimate) plus the output its text
// carried (meter.Outcome.Streamed); with no report, never less than its largest hold, as
// before. known false leaves it to the rule's onError, or the whole hold.
func (b *budget) charge(o meter.Outcome) (used int64, known bool) {
	used, known = o.Usage.Cost(), o.Found
	if o.FromHeader || (o.Found && o.Complete) || o.Streamed == 0 {
		return used, known
	}
	in := b.prompt
	if o.Found {
		in = o.Usage.Input
	}
	est := min(in, tokens.MaxTokens) + min(o.Streamed, tokens.MaxTokens)
	if !o.Found {
		return max(est, b.holds.Most()), true
	}
	return max(used, est), true
}

func writeJSONError(w http.ResponseWriter, status int, code string) {
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "{\"error\":\""+code+"\",\"status\":"+strconv.Itoa(status)+"}\n")
}
