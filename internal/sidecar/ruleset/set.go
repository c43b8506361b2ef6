// Package ruleset turns the namespace's compiled policies document and the pod's labels into
// the immutable rule set the sidecar enforces, and keeps it current as the mounted ConfigMap
// changes.
package ruleset

import (
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/topkeys"
)

// Attributes a key part can take from a request; the values of the API's enum.
const (
	AttrRemoteAddress = "RemoteAddress"
	AttrForwardedFor  = "ForwardedFor"
	AttrPath          = "Path"
	AttrMethod        = "Method"
)

// Set is the rules one sidecar enforces: the policies of the document that select its pod.
// A Set is never modified once built; a reload builds a new one and swaps it in whole.
type Set struct {
	// Namespace of the policies; part of every key.
	Namespace string
	// Hash is the content hash of the document the set was built from.
	Hash string
	// Policies that select this pod, in document order.
	Policies []*Policy
	// Rules of all Policies, in order: the limits per window. In-flight rules are in InFlight,
	// which only the faces that enforce them read.
	Rules []*Rule
	// InFlight are the in-flight rules of all Policies, in order (Rule.InFlight set).
	InFlight []*Rule
	// NeedsForwardedFor says whether some rule keys on the ForwardedFor attribute.
	NeedsForwardedFor bool
	// Total is how many policies the document had, selected or not.
	Total int
}

// Policy is one selected policy.
type Policy struct {
	Name        string
	FailureMode limiter.FailureMode
	// HeadersOnRefusal keeps this policy's RateLimit fields off admitted responses.
	HeadersOnRefusal bool
	Rules            []*Rule
	InFlight         []*Rule
	// Replicas holds the live replica count of the policy's heartbeat group (0 until learnt).
	// It outlives reloads: Sets built by the same Builder share it.
	Replicas *atomic.Int64
	// Peers holds the most live replicas the group had over its last few heartbeats (0 until
	// learnt): a key whose grants wait after a restore decides again once that many replicas
	// re-asserted their shares in it (limiter.Limit.Peers). Shared like Replicas.
	Peers *atomic.Int64
}

// Rule is one rule ready to decide.
type Rule struct {
	Policy *Policy
	Name   string
	// ID is "<policy>/<rule>", the name the RateLimit header fields and logs use.
	ID    string
	Match *Match
	Key   []KeyPart
	// Limit is what the limiter enforces; Replicas is filled in per decision.
	Limit limiter.Limit
	// Shadow rules decide and count but never refuse.
	Shadow bool
	// WindowSeconds is the window rounded up to whole seconds, for the w parameter; for a
	// calendar window its usual length (a day, 7 days, 30 days), which a decision replaces with
	// its period's own (decide.WindowSeconds).
	WindowSeconds int64
	// StateName is the rule name the rule's Redis keys are made with (keyscheme.Key): Name, or
	// for a candidate Name + CandidateSuffix, so that the two never share a counter.
	StateName string
	// Candidate is the rule's candidate limit, decided beside it on the same requests (nil:
	// none): a Rule of its own, Shadow, with the same match and key and its own state, whose
	// CandidateOf is this rule.
	Candidate *Rule
	// CandidateOf is the rule a candidate is counted beside; nil for a rule.
	CandidateOf *Rule
	// ReportValues lets the readable key of the rule's top keys leave the sidecar.
	ReportValues bool
	// CountRefused keeps what the rule counted of a request another rule refused; otherwise
	// it goes back (decide.Decision.GiveBack). A candidate has its rule's.
	CountRefused bool
	// InFlight, when not nil, makes the rule bound the requests of a key in progress at once:
	// Limit is then empty, and the rule is in Set.InFlight, not Set.Rules.
	InFlight *limiter.InFlight
	// Queue, when not nil (an in-flight rule only), lets the proxy's requests of a full key
	// wait for a slot.
	Queue *Queue
	// LetFinish (an in-flight rule only): a request whose slot is lost runs to its end,
	// uncounted, instead of being ended (limit.onSlotLost: Finish).
	LetFinish bool
	// Cost, when not nil, says the rule's cost comes from the response: Limit counts units
	// (such as tokens) that a request holds before it is forwarded and settles after. Nil:
	// every request costs one unit. A rule with a Cost has no Candidate.
	Cost *Cost
	// LongWindow says the rule counts a calendar period or a window over a day: its top keys
	// report how much of the period's quota they used (Top.Quota).
	LongWindow bool
	// Top counts the rule's decisions and its heaviest keys between two heartbeats (nil when
	// the sidecar tracks MaxTrackedRules rules already). It outlives reloads: Sets built by the
	// same Builder share it while the rule (or candidate) exists.
	Top *topkeys.Tracker
}

// CandidateSuffix ends the StateName of a candidate limit. Rule names are DNS labels, which
// cannot hold '~': no rule's state can be a candidate's.
const CandidateSuffix = "~candidate"

// MaxTrackedRules is the most rules and candidates a sidecar keeps top keys of (a Tracker
// each, at most about 10 KiB): the document's size bounds its rules only loosely (thousands),
// and what a sidecar tracks must not grow with it. Rules beyond it, in document order, are
// decided as usual and reported by no summary.
const MaxTrackedRules = 512

// Match restricts a rule to some requests.
type Match struct {
	// Path, when not nil, restricts the rule to the paths it matches.
	Path    *PathMatch
	Methods []string
	Headers []HeaderMatch
}

// PathMatch is Gateway API's HTTPPathMatch, on the decoded normal form of the request path
// (internal/sidecar/reqpath): an exact path, or a prefix of whole path elements; optionally
// ignoring case, and for an exact path one trailing slash, as some application routers do.
type PathMatch struct {
	// Exact compares the whole path with Value.
	Exact bool
	// Value is the path; for a prefix, without its trailing slashes ("" for "/", which
	// matches every path).
	Value string
	// IgnoreCase compares letters case-insensitively (Unicode simple case folding).
	IgnoreCase bool
	// IgnoreTrailingSlash lets an exact path match with one "/" appended: /abc matches
	// /abc and /abc/.
	IgnoreTrailingSlash bool
}

// Matches reports whether path, normalised, is matched. A prefix matches the path equal to
// it and the paths that continue it with a "/": /abc matches /abc, /abc/ and /abc/def, not
// /abcd.
func (m *PathMatch) Matches(path string) bool {
	rest, ok := m.cutPrefix(path)
	switch {
	case !ok:
		return false
	case rest == "":
		return true
	case m.Exact:
		return m.IgnoreTrailingSlash && rest == "/" && m.Value != "/"
	default:
		return rest[0] == '/'
	}
}

// cutPrefix is strings.CutPrefix(path, m.Value), folding case when IgnoreCase.
func (m *PathMatch) cutPrefix(path string) (string, bool) {
	if !m.IgnoreCase {
		return strings.CutPrefix(path, m.Value)
	}
	v := m.Value
	for v != "" {
		if path == "" {
			return "", false
		}
		a, na := utf8.DecodeRuneInString(v)
		b, nb := utf8.DecodeRuneInString(path)
		if !equalFoldRune(a, b) {
			return "", false
		}
		v, path = v[na:], path[nb:]
	}
	return path, true
}

// equalFoldRune reports whether a and b are equal under Unicode simple case folding, as
// strings.EqualFold compares runes.
func equalFoldRune(a, b rune) bool {
	if a == b {
		return true
	}
	for r := unicode.SimpleFold(a); r != a; r = unicode.SimpleFold(r) {
		if r == b {
			return true
		}
	}
	return false
}

// newPathMatch compiles the document's path fields; nil when neither is set.
func newPathMatch(m *policydoc.Match) *PathMatch {
	switch {
	case m.ExactPath != "":
		return &PathMatch{Exact: true, Value: m.ExactPath, IgnoreCase: m.IgnoreCase, IgnoreTrailingSlash: m.IgnoreTrailingSlash}
	case m.PathPrefix != "":
		// Every trailing slash: the schema lets the deprecated pathPrefix end in several, and
		// /api// means the elements of /api all the same.
		return &PathMatch{Value: strings.TrimRight(m.PathPrefix, "/"), IgnoreCase: m.IgnoreCase}
	}
	return nil
}

// HeaderMatch requires a header, with an exact value when Value is not nil.
type HeaderMatch struct {
	// Name is in canonical MIME form, as http.Header stores it.
	Name  string
	Value *string
}

// KeyPart is one part of a rule's key: a header (canonical name), an attribute or a constant.
type KeyPart struct {
	Header    string
	Attribute string
	Constant  string
	// foldCase and trimSlash key a Path the way the rule's path match compares it (ignoring
	// case, one trailing slash), headAsGet keys a HEAD Method as the GET its match counts it
	// as: spellings the rule counts as one request never get keys of their own.
	foldCase, trimSlash, headAsGet bool
}

// AttributeValue returns the key value of the request attribute v (the request's Path or
// Method, as the part's Attribute says), in the form the rule's match compares it.
func (k KeyPart) AttributeValue(v string) string {
	if k.trimSlash && len(v) > 1 {
		v = strings.TrimSuffix(v, "/")
	}
	if k.foldCase {
		v = strings.Map(foldRune, v)
	}
	if k.headAsGet && strings.EqualFold(v, "HEAD") {
		v = "GET"
	}
	return v
}

// foldRune is the smallest rune that r is equal to under simple case folding: one spelling
// for every rune that equalFoldRune says is equal to r.
func foldRune(r rune) rune {
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// Builder builds Sets and keeps the per-policy state that must survive reloads.
type Builder struct {
	// FailureMode, when set, replaces every policy's failure mode (the pod's override).
	FailureMode limiter.FailureMode
	// Namespace is the pod's own namespace (downward API), the namespace of every key and
	// heartbeat. A document naming another is refused: the namespace a sidecar counts in must
	// come from its pod, never from a file a tenant can write (any ConfigMap mounted under the
	// name redline-policies). Empty accepts the document's (tests and tools only; the sidecar
	// requires it).
	Namespace string
	replicas  map[string]*atomic.Int64
	peers     map[string]*atomic.Int64
	trackers  map[string]*topkeys.Tracker
}

// ErrForeignNamespace is wrapped by Build's error for a document of another namespace.
var ErrForeignNamespace = errors.New("policies document names another namespace than the pod's")

// NewBuilder returns a Builder that applies the failure mode override, if any.
func NewBuilder(failureMode limiter.FailureMode) *Builder {
	return &Builder{FailureMode: failureMode, replicas: map[string]*atomic.Int64{}, peers: map[string]*atomic.Int64{}, trackers: map[string]*topkeys.Tracker{}}
}

// Build keeps the policies of doc that select podLabels and compiles their rules. Builds must
// not run concurrently (the watcher runs them one at a time).
func (b *Builder) Build(doc *policydoc.Document, podLabels map[string]string) (*Set, error) {
	ns := doc.Namespace
	if b.Namespace != "" {
		if doc.Namespace != b.Namespace {
			return nil, fmt.Errorf("%w: document %q, pod %q", ErrForeignNamespace, doc.Namespace, b.Namespace)
		}
		ns = b.Namespace
	}
	s := &Set{Namespace: ns, Hash: doc.Hash, Total: len(doc.Policies)}
	trackers := make(map[string]*topkeys.Tracker, min(len(b.trackers), MaxTrackedRules))
	track := func(r *Rule) {
		id := r.ID + strings.TrimPrefix(r.StateName, r.Name)
		if t := b.trackers[id]; t != nil {
			r.Top = t
		} else if len(trackers) < MaxTrackedRules {
			r.Top = topkeys.NewTracker()
		}
		if r.Top != nil {
			trackers[id] = r.Top
		}
	}
	defer func() { b.trackers = trackers }()
	for i := range doc.Policies {
		cp := &doc.Policies[i]
		if !cp.Selects(podLabels) {
			continue
		}
		p := &Policy{
			Name: cp.Name, FailureMode: limiter.FailureMode(cp.FailureMode),
			HeadersOnRefusal: cp.HeadersOnRefusal, Replicas: counter(b.replicas, cp.Name), Peers: counter(b.peers, cp.Name),
		}
		if b.FailureMode != "" {
			p.FailureMode = b.FailureMode
		}
		for _, cr := range cp.Rules {
			r, err := buildRule(p, cr)
			if err != nil {
				return nil, fmt.Errorf("policy %s rule %s: %w", cp.Name, cr.Name, err)
			}
			for _, k := range r.Key {
				s.NeedsForwardedFor = s.NeedsForwardedFor || k.Attribute == AttrForwardedFor
			}
			track(r)
			if r.InFlight != nil {
				p.InFlight = append(p.InFlight, r)
				s.InFlight = append(s.InFlight, r)
				continue
			}
			if r.Candidate != nil {
				track(r.Candidate)
			}
			p.Rules = append(p.Rules, r)
			s.Rules = append(s.Rules, r)
		}
		s.Policies = append(s.Policies, p)
	}
	return s, nil
}

// counter returns m's counter of policy, made on first use.
func counter(m map[string]*atomic.Int64, policy string) *atomic.Int64 {
	if r, ok := m[policy]; ok {
		return r
	}
	r := new(atomic.Int64)
	m[policy] = r
	return r
}

func buildRule(p *Policy, cr policydoc.Rule) (*Rule, error) {
	r := &Rule{
		Policy: p,
		Name:   cr.Name,
		ID:     p.Name + "/" + cr.Name,
		Shadow: cr.Mode == "Shadow",
		Limit: limiter.Limit{
			Algorithm:   limiter.Algorithm(cr.Algorithm),
			Requests:    cr.Requests,
			Window:      time.Duration(cr.WindowMS) * time.Millisecond,
			Burst:       cr.Burst,
			FailureMode: p.FailureMode,
			Shadow:      cr.Mode == "Shadow",
			Durability:  durabilityOf(cr.Durability),
			Policy:      p.Name,
		},
		WindowSeconds: (cr.WindowMS + 999) / 1000,
		StateName:     cr.Name,
		ReportValues:  cr.ReportValues,
		CountRefused:  cr.CountRefused,
	}
	switch cr.Mode {
	case "Enforce", "Shadow":
	default:
		return nil, fmt.Errorf("unknown mode %q", cr.Mode)
	}
	if cr.InFlight != 0 {
		if cr.InFlight > limiter.MaxInFlight {
			return nil, fmt.Errorf("checking limit: inFlight %d above %d", cr.InFlight, limiter.MaxInFlight)
		}
		r.Limit, r.WindowSeconds = limiter.Limit{}, 0
		r.InFlight = &limiter.InFlight{Max: cr.InFlight, FailureMode: p.FailureMode, Shadow: r.Shadow}
		r.LetFinish = cr.OnSlotLost == policydoc.SlotLostFinish
		if q := cr.Queue; q != nil {
			r.Queue = &Queue{Size: int(q.Size), Timeout: time.Duration(q.TimeoutMS) * time.Millisecond}
		}
	} else if err := r.setCalendar(cr.Calendar); err != nil {
		return nil, err
	} else if err := r.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("checking limit: %w", err)
	}
	r.LongWindow = r.InFlight == nil && (r.Limit.Calendar != nil || r.Limit.Window > 24*time.Hour)
	cost, err := newCost(cr.Cost)
	if err != nil {
		return nil, err
	}
	r.Cost = cost
	if m := cr.Match; m != nil {
		r.Match = &Match{Path: newPathMatch(m), Methods: m.Methods}
		for _, h := range m.Headers {
			r.Match.Headers = append(r.Match.Headers, HeaderMatch{Name: textproto.CanonicalMIMEHeaderKey(h.Name), Value: h.Value})
		}
	}
	if r.Key, err = keyParts(cr.Key, r.Match); err != nil {
		return nil, err
	}
	if c := cr.Candidate; c != nil {
		cand := *r
		cand.Shadow, cand.StateName, cand.CandidateOf = true, cr.Name+CandidateSuffix, r
		cand.Limit = limiter.Limit{
			Algorithm: limiter.Algorithm(c.Algorithm), Requests: c.Requests,
			Window: time.Duration(c.WindowMS) * time.Millisecond, Burst: c.Burst,
			FailureMode: p.FailureMode, Shadow: true, Policy: p.Name,
		}
		cand.WindowSeconds = (c.WindowMS + 999) / 1000
		if err := cand.setCalendar(c.Calendar); err != nil {
			return nil, fmt.Errorf("checking candidate limit: %w", err)
		}
		if err := cand.Limit.Validate(); err != nil {
			return nil, fmt.Errorf("checking candidate limit: %w", err)
		}
		r.Candidate = &cand
	}
	return r, nil
}

// Find returns the rule named rule of the policy named policy, or nil.
func (s *Set) Find(policy, rule string) *Rule {
	for _, p := range s.Policies {
		if p.Name != policy {
			continue
		}
		for _, r := range p.Rules {
			if r.Name == rule {
				return r
			}
		}
	}
	return nil
}

// FindInFlight returns the in-flight rule of that policy and name, or nil.
func (s *Set) FindInFlight(policy, rule string) *Rule {
	for _, p := range s.Policies {
		if p.Name != policy {
			continue
		}
		for _, r := range p.InFlight {
			if r.Name == rule {
				return r
			}
		}
	}
	return nil
}

// PolicyNames returns the names of the selected policies.
func (s *Set) PolicyNames() []string {
	out := make([]string, len(s.Policies))
	for i, p := range s.Policies {
		out[i] = p.Name
	}
	return out
}

// setCalendar makes r count the periods of c (nil: none). Its WindowSeconds is the unit's usual
// length: what a face says of a period when no decision told its own.
func (r *Rule) setCalendar(c *policydoc.Calendar) error {
	if c == nil {
		return nil
	}
	cal, err := calendar.New(c.Spec())
	if err != nil {
		return fmt.Errorf("checking limit: %w", err)
	}
	r.Limit.Calendar = cal
	r.WindowSeconds = map[calendar.Unit]int64{calendar.Day: 86400, calendar.Week: 7 * 86400, calendar.Month: 30 * 86400}[cal.Spec().Unit]
	return nil
}

// durabilityOf is the limiter's form of a rule's durability (the document checked it).
func durabilityOf(d *policydoc.Durability) limiter.Durability {
	if d == nil {
		return limiter.Durability{}
	}
	return limiter.Durability{Mode: limiter.DurabilityMode(d.Mode), Timeout: time.Duration(d.TimeoutMS) * time.Millisecond}
}
