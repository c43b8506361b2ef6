// Package decide is the sidecar's decision core: which rules a request matches and the key each
// rule counts it under (a Plan, made once per request), one limiter call per matching rule, and
// the verdict with its RateLimit header fields. It does no I/O of its own; its Limiter does.
package decide

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// Request is what a decision looks at.
type Request struct {
	Method string
	// Path is the request path, without the query.
	Path string
	// Header holds the request's header fields, names in canonical form (as net/http keeps them).
	Header http.Header
	// RemoteAddr is the peer's address, "ip" or "ip:port".
	RemoteAddr string
}

// Hit names one rule and gives its key parts directly, for callers that built the key
// themselves (the decision API, Envoy descriptors).
type Hit struct {
	Policy string
	Rule   string
	Key    []string
	// Cost, when positive, is what this hit takes from its limit instead of the call's cost
	// (Envoy's per-descriptor hits_addend).
	Cost int64
}

// Outcome is one rule's decision.
type Outcome struct {
	Rule   *ruleset.Rule
	Result limiter.Result

	// key, replicas and peers are what the decision was made under, which GiveBack gives back
	// to (the rule set may have been swapped since; Rule.Limit never changes): the limit is
	// Rule.Limit with the policy's replicas and peers as they were then (see limitOf), kept as
	// two numbers rather than a copy of the whole limit, which every outcome would carry.
	key             string
	replicas, peers int64
}

// limit is the limit o was decided under.
func (o *Outcome) limit() limiter.Limit {
	lim := o.Rule.Limit
	lim.Replicas, lim.Peers = o.replicas, o.peers
	return lim
}

// Refuses says whether this outcome refuses the request: an Enforce rule over its limit.
func (o *Outcome) Refuses() bool { return !o.Rule.Shadow && !o.Result.Allowed }

// Decision is the verdict on one request.
type Decision struct {
	// Allowed is false when some Enforce rule refused.
	Allowed bool
	// Outcomes has one entry per matching rule, in rule order.
	Outcomes []Outcome
	// Candidates has one entry per matching rule with a candidate limit, in rule order: what
	// the candidate decided (Result.OverLimit: it would have refused). Never part of the
	// verdict, the headers or a face's per-rule answer. The decision does not wait for them:
	// they are filled in by WaitCandidates.
	Candidates []Outcome
	// Refused is the refusing outcome with the longest retry-after, when not Allowed.
	Refused *Outcome

	pending  *pendingCandidates
	engine   *Engine // that decided it, for GiveBack
	gaveBack bool
}

// WaitCandidates waits for the candidates' decisions and returns them (Candidates). A face
// that shows them (the decision API) waits; the proxy and the Envoy face never do, so a
// candidate never holds up a request.
func (d *Decision) WaitCandidates() []Outcome {
	if d.pending != nil {
		d.pending.wg.Wait()
		d.Candidates, d.pending = d.pending.outs, nil
	}
	return d.Candidates
}

// Engine decides requests against a rule set.
type Engine struct {
	// Limiter decides, holds and takes slots: the sidecar's *limiter.Limiter (nil only for an
	// engine that plans and explains).
	Limiter Limiter
	// TrustedHops is how many proxies in front of the sidecar append to X-Forwarded-For and
	// are trusted to; see ClientIP.
	TrustedHops int
	// Observe, if set, hears of every outcome (metrics), candidates' included (their Rule's
	// CandidateOf is set).
	Observe func(*ruleset.Rule, limiter.Result)
	// ObserveSettle, if set, hears of every settle of a hold (metrics): what went back, what
	// became debt, or why the settle failed (the hold then goes back at its deadline).
	ObserveSettle func(*ruleset.Rule, limiter.Settled, error)
	// ObserveSlot, if set, hears of every in-flight rule's decision (metrics).
	ObserveSlot func(*ruleset.Rule, limiter.SlotResult)
	// OnSlots, if set, hears of every slot a request takes (+1) and gives back (-1), by rule
	// (the per-rule gauge of requests in progress).
	OnSlots func(r *ruleset.Rule, delta int)
	// OnLetFinish, if set, hears of every slot lost before its request ended whose rule lets
	// the request finish (Slots.WatchLost).
	OnLetFinish func(r *ruleset.Rule)
	// Queue, if set, is where the proxy's requests of a full key wait for a slot of a rule
	// with a queue (WaitSlots); a slot given back wakes its key's waiters.
	Queue *slotqueue.Queue
	// OnQueued, if set, hears of every request that starts (+1) and stops (-1) waiting in
	// Queue, by rule (the per-rule gauge of requests queued).
	OnQueued func(r *ruleset.Rule, delta int)
	// Log, if set, writes the decisions it keeps (see DecisionLog).
	Log *DecisionLog
}

// ErrUnknownRule is wrapped by errors about a Hit that names no rule of the set.
var ErrUnknownRule = errors.New("unknown policy or rule")

// Decide decides every rule per window of plan, each under its own key and at its cost, as one
// batch: the limiter pipelines them. A rule whose cost comes from the response counts its
// plain cost here (Reserve holds for it instead). An empty plan admits.
func (e *Engine) Decide(ctx context.Context, plan *Plan) Decision {
	if len(plan.calls) == 0 {
		return Decision{Allowed: true}
	}
	return e.decided(ctx, e.run(ctx, plan.calls))
}

// decided gives back what d counted when some rule refused it.
func (e *Engine) decided(ctx context.Context, d Decision) Decision {
	if !d.Allowed {
		d.GiveBack(ctx)
	}
	return d
}

// run decides every call, with one round trip for all of them (AllowAll), so that the request
// waits for one round trip, not one per rule. Candidates ride in the same batch, detached: the
// verdict does not wait for them.
func (e *Engine) run(ctx context.Context, calls []call) Decision {
	d := Decision{Allowed: true, engine: e}
	if len(calls) == 0 {
		return d
	}
	results := make([]Outcome, len(calls))
	// slot[i] is the index of call i among the candidates, -1 for a rule.
	slot := make([]int, len(calls))
	var pending *pendingCandidates
	for i, c := range calls {
		slot[i] = -1
		if c.rule.CandidateOf != nil {
			if pending == nil {
				pending = &pendingCandidates{}
			}
			slot[i] = pending.add()
		}
	}
	if pending != nil {
		pending.wg.Add(len(pending.outs))
	}
	if len(calls) == 1 {
		results[0] = e.one(ctx, calls[0])
	} else {
		asks := make([]limiter.Ask, len(calls))
		for i, c := range calls {
			asks[i] = limiter.Ask{Key: c.key, Limit: limitOf(c.rule), Cost: c.cost, Detached: slot[i] >= 0}
		}
		res, errs := e.Limiter.AllowAll(ctx, asks, func(i int, r limiter.Result, err error) {
			pending.arrive(e, slot[i], e.outcome(calls[i], asks[i].Limit, r, err))
		})
		for i, c := range calls {
			if slot[i] < 0 {
				results[i] = e.outcome(c, asks[i].Limit, res[i], errs[i])
			}
		}
	}
	d.pending = pending
	d.Outcomes = results
	if pending != nil {
		d.Outcomes = make([]Outcome, 0, len(calls)-len(pending.outs))
		for i := range calls {
			if slot[i] < 0 {
				d.Outcomes = append(d.Outcomes, results[i])
			}
		}
	}
	d.verdict()
	return d
}

// verdict sets Allowed and Refused from the outcomes: refused when some Enforce rule refused,
// by the one with the longest retry-after.
func (d *Decision) verdict() {
	d.Allowed, d.Refused = true, nil
	for i := range d.Outcomes {
		o := &d.Outcomes[i]
		if !o.Refuses() {
			continue
		}
		d.Allowed = false
		if d.Refused == nil || retryLonger(o.Result.RetryAfter, d.Refused.Result.RetryAfter) {
			d.Refused = o
		}
	}
}

// retryLonger orders retry-afters, -1 (never) being the longest.
func retryLonger(a, b time.Duration) bool {
	if a < 0 {
		return b >= 0
	}
	return b >= 0 && a > b
}

// limitOf is the rule's limit with what the heartbeats learnt of its group.
func limitOf(r *ruleset.Rule) limiter.Limit {
	lim := r.Limit
	lim.Replicas = r.Policy.Replicas.Load()
	lim.Peers = r.Policy.Peers.Load()
	return lim
}

func (e *Engine) one(ctx context.Context, c call) Outcome {
	lim := limitOf(c.rule)
	res, err := e.Limiter.Allow(ctx, c.key, lim, c.cost)
	return e.outcome(c, lim, res, err)
}

// outcome finishes one call's decision: the failure mode where the limiter failed, the
// metrics, and the rule's top keys.
func (e *Engine) outcome(c call, lim limiter.Limit, res limiter.Result, err error) Outcome {
	if err != nil {
		// Only a closed limiter or an invalid cost gets here; decide as Redis being down would.
		res = failureResult(lim, c.cost, err)
	}
	if e.Observe != nil {
		e.Observe(c.rule, res)
	}
	if e.Log != nil {
		e.Log.observe(c.rule, c.key, c.parts, res)
	}
	if t := c.rule.Top; t != nil {
		label := ""
		if c.rule.ReportValues {
			label = strings.Join(c.parts, " ")
		}
		hash := keyscheme.Hash(c.key)
		t.Observe(hash, label, res.OverLimit)
		if c.rule.LongWindow {
			useQuota(t, lim, hash, label, res)
		}
	}
	return Outcome{Rule: c.rule, Result: res, key: c.key, replicas: lim.Replicas, peers: lim.Peers}
}

// failureResult decides by the limit's failure mode without any limiter. LocalFallback admits:
// without a limiter there is no local count to enforce.
func failureResult(lim limiter.Limit, cost int64, err error) limiter.Result {
	r := limiter.Result{Allowed: true, Remaining: max(lim.Requests-cost, 0), Source: limiter.SourceFailOpen, Err: err}
	if lim.FailureMode == limiter.FailureModeClosed {
		r = limiter.Result{OverLimit: true, RetryAfter: time.Second, ResetAfter: time.Second, Source: limiter.SourceFailClosed, Err: err}
		if lim.Shadow {
			r.Allowed = true
		}
	}
	return r
}

// matches reports whether a rule's match admits the request. A nil match matches everything.
func matches(m *ruleset.Match, req *Request) bool {
	return m.Matches(req.Method, req.Path, req.Header)
}

// RepeatedHeaderError is the error of a request that carries more than one field of a header
// that a rule it matches keys on.
type RepeatedHeaderError struct {
	// Header is the header's name, in canonical form.
	Header string
}

func (e *RepeatedHeaderError) Error() string {
	return fmt.Sprintf("header %s is sent more than once, and a rule keys on it: send it once", e.Header)
}

// attrs resolves key parts of one request, computing the client IP at most once.
type attrs struct {
	req      *Request
	hops     int
	clientIP string
	resolved bool
}

func (a *attrs) parts(key []ruleset.KeyPart) []string {
	out := make([]string, len(key))
	for i, k := range key {
		switch {
		case k.Header != "":
			vals := a.req.Header[k.Header]
			switch len(vals) {
			case 0:
			case 1:
				out[i] = vals[0]
			default:
				// Plan refuses such a request first. Should one not, all
				// values count, so that a second field never picks a key of its own.
				out[i] = strings.Join(vals, ",")
			}
		case k.Attribute == ruleset.AttrRemoteAddress:
			out[i] = hostOnly(a.req.RemoteAddr)
		case k.Attribute == ruleset.AttrForwardedFor:
			if !a.resolved {
				a.clientIP, a.resolved = ClientIP(a.req.Header.Values("X-Forwarded-For"), hostOnly(a.req.RemoteAddr), a.hops), true
			}
			out[i] = a.clientIP
		case k.Attribute == ruleset.AttrPath:
			out[i] = k.AttributeValue(a.req.Path)
		case k.Attribute == ruleset.AttrMethod:
			out[i] = k.AttributeValue(a.req.Method)
		default:
			out[i] = k.Constant
		}
	}
	return out
}

// hostOnly strips the port from an address, if it has one.
func hostOnly(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// ClientIP returns the client address behind trustedHops proxies. Each trusted proxy appends
// the address it received the request from to X-Forwarded-For, so the client is the
// trustedHops-th entry from the right; entries further left were written by the client and
// cannot be trusted: they are never read. With 0 trusted hops, or no X-Forwarded-For, it is
// the connection's peer. When the list is shorter than trustedHops, its leftmost entry (written
// by a trusted proxy) is the best known.
//
// The entry is taken as a trusted proxy wrote it, less what varies per connection: a port
// (some load balancers write ip:port) is dropped and an IP is written in its canonical form,
// so that a client cannot get a new key by reconnecting or by its address's spelling.
func ClientIP(xff []string, remote string, trustedHops int) string {
	if trustedHops <= 0 || len(xff) == 0 {
		return remote
	}
	// Walk the entries from the right across every X-Forwarded-For field.
	n := 0
	last := ""
	for _, field := range slices.Backward(xff) {
		for field != "" {
			var entry string
			if j := strings.LastIndexByte(field, ','); j >= 0 {
				entry, field = field[j+1:], field[:j]
			} else {
				entry, field = field, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			n++
			last = entry
			if n == trustedHops {
				return canonicalAddr(entry)
			}
		}
	}
	if last == "" {
		return remote
	}
	return canonicalAddr(last)
}

// canonicalAddr is entry without a port, and in netip's canonical form (IPv4-mapped IPv6 as
// IPv4) when it is an IP; anything else as it is.
func canonicalAddr(entry string) string {
	host := hostOnly(entry)
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1] // a bracketed IPv6 address without a port
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
	}
	return host
}
