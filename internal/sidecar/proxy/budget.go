package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/meter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/tokens"
)

// Token budgets: a request some rule of which takes its cost from the response (ruleset.Cost)
// is sized from its body, holds what it may spend before it is sent, has its output cap
// lowered to what the hold affords, and settles with the usage its response reports.
//
//  1. The body is read for sizing within bounds (tokens.MaxRequestBytes, Options.BodyReadTimeout);
//     a body over them, or one whose shape is not understood, holds the rule's defaultHold and
//     goes to the application untouched.
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

// budgetKey is the context key of a request's *budget.
type budgetKey struct{}

// budget is one request's holds on their way to their settle.
type budget struct {
	holds *decide.Holds
	kind  tokens.Kind
	strip bool
	cost  *ruleset.Cost
	once  sync.Once
	wg    sync.WaitGroup
}

// settle ends the holds once, off the goroutine that calls it: the meter calls it on the
// proxy's copy loop, which should not wait for Redis.
func (b *budget) settle(ctx context.Context, used int64, known, failed bool) {
	b.once.Do(func() {
		b.wg.Go(func() { _, _ = b.holds.Settle(ctx, used, known, failed) })
	})
}

// firstCost is the cost of the first rule of set that matches req and takes its cost from the
// response: it names the API whose bodies are read and the cost header. Rules with costs of
// different APIs on the same requests are read as the first one says.
func firstCost(set *ruleset.Set, req *decide.Request) *ruleset.Cost {
	for _, r := range set.Rules {
		if r.Cost != nil && decide.Matches(r.Match, req) {
			return r.Cost
		}
	}
	return nil
}

// serveBudget decides, holds, forwards and settles a request of a token budget.
func (h *Handler) serveBudget(w http.ResponseWriter, r *http.Request, set *ruleset.Set, req *decide.Request) {
	c := firstCost(set, req)
	kind, pathStream := c.KindFor(r.URL.Path)
	need := decide.Need{}
	var body []byte
	var sized tokens.Request
	if kind != tokens.Unknown {
		b, err := meter.ReadBody(r, tokens.MaxRequestBytes, h.opts.BodyReadTimeout)
		if err == nil {
			if tr, err := tokens.ScanRequest(b, kind, pathStream); err == nil {
				body, sized = b, tr
				need = decide.Need{Sized: true, Prompt: tr.PromptTokens, Output: tr.MaxOutput()}
			}
		}
	}
	d, hs, err := h.opts.Engine.Reserve(r.Context(), set, req, need)
	if err != nil {
		h.opts.Log.Error("holding for a token budget", "error", err)
		writeJSONError(w, http.StatusServiceUnavailable, "token_budget_unavailable")
		return
	}
	if !d.Allowed {
		refuse(w, &d)
		return
	}
	if h.opts.Headers {
		d.Fields().Write(w.Header())
	}
	b := &budget{holds: hs, kind: kind, cost: c}
	if body != nil {
		b.strip = h.capOutput(r, body, kind, sized, hs)
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

// capOutput lowers the request's output cap to what its holds afford, per choice, and asks an
// OpenAI chat stream for its usage when the client did not; it reports whether it asked (the
// usage chunk is then removed from the response). The body is rewritten only when needed.
func (h *Handler) capOutput(r *http.Request, body []byte, kind tokens.Kind, sized tokens.Request, hs *decide.Holds) (asked bool) {
	limit, lowered := sized.OutputCap, false // 0: none
	if units, capped := hs.Afford(); capped {
		per := max(units-sized.PromptTokens, 0) / max(sized.Choices, 1)
		if limit == 0 || per < limit {
			limit, lowered = per, true
		}
	}
	ask := kind == tokens.OpenAIChat && sized.Stream && !sized.IncludeUsage
	if !lowered && (!ask || limit == 0) {
		// Nothing to change; or only the usage to ask for, of a request that no Enforce rule
		// caps and that set no cap itself, which SetOutputCap cannot leave uncapped: it goes
		// as sent, and its settle has no usage (the whole hold, of Shadow rules only).
		return false
	}
	nb, err := tokens.SetOutputCap(body, kind, limit, ask)
	if err != nil {
		h.opts.Log.Warn("setting the output cap of a token budget's request", "error", err)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(nb))
	r.ContentLength = int64(len(nb))
	r.Header["Content-Length"] = []string{strconv.Itoa(len(nb))}
	r.TransferEncoding = nil
	return ask
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
		b.settle(ctx, o.Usage.Cost(), o.Found, !o.Complete || status >= http.StatusBadRequest)
	}})
	return nil
}

func writeJSONError(w http.ResponseWriter, status int, code string) {
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "{\"error\":\""+code+"\",\"status\":"+strconv.Itoa(status)+"}\n")
}
