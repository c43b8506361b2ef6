// Package policydoc is the document that carries the RateLimitPolicies of a namespace to its
// sidecars (ConfigMap redline-policies, key policies.json): its types, how it is built and
// how it is read back.
//
// The document is deterministic: the same policies give the same bytes, whatever order the
// API server listed them in, so its content hash changes only when what is enforced changes.
// The package imports nothing of Kubernetes, so the sidecar stays small; the controller
// compiles API objects into it.
package policydoc

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/calendar"
)

// Names of the per-namespace ConfigMap.
const (
	ConfigMapName = "redline-policies"
	DataKey       = "policies.json"
	// GzipDataKey is the binaryData key of the gzip-compressed document, used instead of
	// DataKey when the plain document does not fit in a ConfigMap.
	GzipDataKey = "policies.json.gz"
	// MaxDocumentBytes bounds a document, compressed or not: the controller writes none
	// larger, and readers (the sidecar, the controller reading back what it wrote) refuse a
	// larger one before parsing it, so that a small compressed file can never expand without
	// limit in a reader. It is what the sidecar loads within its default memory limit (64Mi):
	// loading a document allocates 13 to 14 times its size (measured over the shapes of
	// TestSidecarLoadsTheLargestDocumentWithinItsBudget in internal/controller), so 768 KiB
	// take at most 11 MiB, within the 16 MiB kept for a reload beside the 40 MiB the sidecar
	// peaks at under load.
	MaxDocumentBytes = 768 << 10
	// FormatVersion is bumped on incompatible changes of the document.
	FormatVersion = 1
)

// Document is the compiled configuration of one namespace.
type Document struct {
	// Version is FormatVersion.
	Version int `json:"version"`
	// Namespace the policies live in.
	Namespace string `json:"namespace"`
	// Hash is the SHA-256 of the document with Hash empty, hex encoded.
	Hash string `json:"hash"`
	// Scripts maps algorithm to the SHA1 of its Redis script.
	Scripts map[string]string `json:"scripts"`
	// Policies sorted by name.
	Policies []Policy `json:"policies"`
}

// Policy is one compiled RateLimitPolicy.
type Policy struct {
	Name        string   `json:"name"`
	Generation  int64    `json:"generation"`
	Selector    Selector `json:"selector"`
	FailureMode string   `json:"failureMode"`
	// HeadersOnRefusal keeps the policy's RateLimit fields off admitted responses.
	HeadersOnRefusal bool   `json:"headersOnRefusal,omitempty"`
	Rules            []Rule `json:"rules"`
}

// Rule is one compiled rule. Its order in Policy.Rules is the order of the spec.
type Rule struct {
	Name      string    `json:"name"`
	Match     *Match    `json:"match,omitempty"`
	Key       []KeyPart `json:"key"`
	Algorithm string    `json:"algorithm"`
	Requests  int64     `json:"requests"`
	WindowMS  int64     `json:"windowMs"`
	Burst     int64     `json:"burst,omitempty"`
	Mode      string    `json:"mode"`
	// Candidate is a limit counted beside the rule's on the same requests, in its own Redis
	// state, that never refuses. Omitted when not set, so a document without one stays
	// readable by sidecars that do not know the field; one that knows it not refuses the
	// document and keeps its last good one.
	Candidate *Candidate `json:"candidate,omitempty"`
	// ReportValues lets the sidecar publish the readable key (header values, addresses) of
	// the rule's top keys beside their hashes.
	ReportValues bool `json:"reportValues,omitempty"`
	// Cost is set when the rule's cost comes from the response, with every default resolved.
	// Omitted when a request costs one unit, so a document without token budgets stays
	// readable by sidecars that do not know the field; one of them refuses a document with it
	// and keeps its last good one, rather than count a token budget in requests.
	Cost *Cost `json:"cost,omitempty"`
	// CountRefused keeps what the rule counted of a request another rule refused (by default
	// it goes back). Omitted when false, so a document without it stays readable by sidecars
	// that do not know the field; one of them refuses a document with it and keeps its last
	// good one, rather than give back what the rule says to keep. Never with Cost.
	CountRefused bool `json:"countRefused,omitempty"`
	// InFlight, when set, makes the rule bound the requests of a key in progress at once
	// instead of the requests per window: Algorithm, Requests, WindowMS and Burst are then
	// empty, and it has no Candidate, Cost nor CountRefused. Omitted when not set, so a
	// document without in-flight rules stays readable by sidecars that do not know the field;
	// one of them refuses a document with it and keeps its last good one, rather than take an
	// in-flight rule for a limit per window.
	InFlight int64 `json:"inFlight,omitempty"`
	// Queue, with InFlight only, lets requests of a full key wait for a slot. Omitted when not
	// set, so a document without queues stays readable by sidecars that do not know the field;
	// one of them refuses a document with it and keeps its last good one, rather than refuse
	// at once what the rule says should wait.
	Queue *Queue `json:"queue,omitempty"`
	// OnSlotLost, with InFlight only, is SlotLostFinish when a request whose slot is lost
	// runs to its end uncounted, rather than being ended. Omitted for the default (End), so a
	// document without it stays readable by sidecars that do not know the field; one of them
	// refuses a document with it and keeps its last good one, rather than end what the rule
	// says to let finish.
	OnSlotLost string `json:"onSlotLost,omitempty"`
	// Calendar, when set, makes a FixedWindow count the periods of a calendar (see package
	// calendar); WindowMS is then the longest a period can be. Omitted when not set, so a
	// document without calendar windows stays readable by sidecars that do not know the field;
	// one of them refuses a document with it and keeps its last good one, rather than count a
	// day of a time zone as 26 hours from the epoch.
	Calendar *Calendar `json:"calendar,omitempty"`
	// Durability is what the rule's grants wait for (see durability.go). Omitted when none, so
	// a document without it stays readable by sidecars that do not know the field; one of
	// them refuses a document with it and keeps its last good one, rather than answer grants
	// before the acknowledgement the rule asks for.
	Durability *Durability `json:"durability,omitempty"`
}

// Calendar is a rule's calendar window: Unit Day, Week or Month in Zone (an IANA name, empty
// for UTC), weeks from FirstWeekday (0 Sunday to 6 Saturday), months from BillingDay (1-31).
type Calendar struct {
	Unit         string `json:"unit"`
	Zone         string `json:"zone,omitempty"`
	FirstWeekday int    `json:"firstWeekday,omitempty"`
	BillingDay   int    `json:"billingDay,omitempty"`
}

// Spec is c as package calendar takes it.
func (c *Calendar) Spec() calendar.Spec {
	return calendar.Spec{Unit: calendar.Unit(c.Unit), Zone: c.Zone, FirstWeekday: time.Weekday(c.FirstWeekday), BillingDay: c.BillingDay}
}

// MaxInFlight bounds Rule.InFlight.
const MaxInFlight = 100_000

// Bounds of a Queue: waiters of a key in one sidecar, and the longest wait.
const (
	MaxQueueSize      = 10_000
	MaxQueueTimeoutMS = 10 * 60 * 1000
)

// SlotLostFinish is Rule.OnSlotLost for a rule whose requests run on when their slot is lost.
const SlotLostFinish = "Finish"

// Queue is how requests of an in-flight rule's full key wait for a slot in a sidecar: at most
// Size of a key at once, each at most TimeoutMS.
type Queue struct {
	Size      int64 `json:"size"`
	TimeoutMS int64 `json:"timeoutMs"`
}

// Candidate is a rule's candidate limit.
type Candidate struct {
	Algorithm string `json:"algorithm"`
	Requests  int64  `json:"requests"`
	WindowMS  int64  `json:"windowMs"`
	Burst     int64  `json:"burst,omitempty"`
	// Calendar is as a Rule's. Omitted when not set, so a document without it stays readable
	// by sidecars that do not know the field (one of them refuses a document with it).
	Calendar *Calendar `json:"calendar,omitempty"`
}

// Match restricts a rule to some requests. Paths are decoded (as the sidecar matches them)
// and at most one of PathPrefix and ExactPath is set.
//
// A prefix match is written as pathPrefix, the field every release of the sidecar reads: a
// document without exact matches stays readable by the sidecars of the previous release
// (which compare the prefix by character, not by path element, until they are upgraded). An
// exact match needs the newer field, which an older sidecar refuses as unknown, keeping its
// last good document: it never enforces an exact rule as a prefix.
type Match struct {
	// PathPrefix matches by path element; a trailing "/" is ignored.
	PathPrefix string `json:"pathPrefix,omitempty"`
	// ExactPath matches one path.
	ExactPath string `json:"exactPath,omitempty"`
	// IgnoreCase compares the path case-insensitively. IgnoreTrailingSlash lets ExactPath
	// match with one "/" appended. Both are omitted when false, so a document without them
	// stays readable by sidecars that do not know them; one of those refuses a document
	// with them and keeps its last good one, rather than let the requests it would count
	// through uncounted.
	IgnoreCase          bool          `json:"ignoreCase,omitempty"`
	IgnoreTrailingSlash bool          `json:"ignoreTrailingSlash,omitempty"`
	Methods             []string      `json:"methods,omitempty"`
	Headers             []HeaderMatch `json:"headers,omitempty"`
}

// HeaderMatch matches a header (name lowercased) by presence or exact value.
type HeaderMatch struct {
	Name  string  `json:"name"`
	Value *string `json:"value,omitempty"`
}

// KeyPart is one part of a key: exactly one field is set. Header names are lowercased.
type KeyPart struct {
	Header    string `json:"header,omitempty"`
	Attribute string `json:"attribute,omitempty"`
	Constant  string `json:"constant,omitempty"`
}

// Build assembles the document of a namespace from compiled policies and script SHAs, sorted
// and hashed. The input slice is not modified.
func Build(namespace string, policies []Policy, scripts map[string]string) (*Document, []byte, error) {
	doc := &Document{
		Version:   FormatVersion,
		Namespace: namespace,
		Scripts:   scripts,
		Policies:  make([]Policy, len(policies)),
	}
	for i, p := range policies {
		p.Selector.MatchExpressions = slices.Clone(p.Selector.MatchExpressions)
		p.Selector.canonical()
		doc.Policies[i] = p
	}
	slices.SortFunc(doc.Policies, func(a, b Policy) int { return strings.Compare(a.Name, b.Name) })
	hash, err := contentHash(doc)
	if err != nil {
		return nil, nil, err
	}
	doc.Hash = hash
	data, err := marshal(doc)
	if err != nil {
		return nil, nil, err
	}
	return doc, data, nil
}

func contentHash(doc *Document) (string, error) {
	c := *doc
	c.Hash = ""
	data, err := marshal(&c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// marshal writes indented JSON (readable with kubectl get -o yaml); encoding/json sorts map
// keys, which keeps the bytes deterministic.
func marshal(doc *Document) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding policies document: %w", err)
	}
	return buf.Bytes(), nil
}

// Parse reads a document and checks it as strictly as the compiler writes it: unknown fields,
// a wrong version, a hash that does not match the content or an invalid rule are refused, so a
// corrupt file never replaces a good one.
func Parse(data []byte) (*Document, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("parsing policies document: %w", err)
	}
	if doc.Version != FormatVersion {
		return nil, fmt.Errorf("policies document version %d, this build reads %d", doc.Version, FormatVersion)
	}
	want, err := contentHash(&doc)
	if err != nil {
		return nil, err
	}
	if doc.Hash != want {
		return nil, fmt.Errorf("policies document hash %q does not match its content (%s)", doc.Hash, want)
	}
	for _, p := range doc.Policies {
		if err := p.Selector.Validate(); err != nil {
			return nil, fmt.Errorf("policy %s: selector: %w", p.Name, err)
		}
		if len(p.Rules) == 0 {
			return nil, fmt.Errorf("policy %s has no rules", p.Name)
		}
		for _, r := range p.Rules {
			if r.InFlight != 0 {
				if err := r.validInFlight(); err != nil {
					return nil, fmt.Errorf("policy %s rule %s: %w", p.Name, r.Name, err)
				}
				continue
			}
			if r.Queue != nil {
				return nil, fmt.Errorf("policy %s rule %s: a queue without inFlight", p.Name, r.Name)
			}
			if r.OnSlotLost != "" {
				return nil, fmt.Errorf("policy %s rule %s: onSlotLost without inFlight", p.Name, r.Name)
			}
			if r.Requests < 1 || r.WindowMS < 1000 || len(r.Key) == 0 {
				return nil, fmt.Errorf("policy %s rule %s: invalid limit or key", p.Name, r.Name)
			}
			if c := r.Candidate; c != nil && (c.Requests < 1 || c.WindowMS < 1000) {
				return nil, fmt.Errorf("policy %s rule %s: invalid candidate limit", p.Name, r.Name)
			}
			if c := r.Candidate; c != nil {
				if err := validCalendar(c.Calendar, c.Algorithm, c.WindowMS); err != nil {
					return nil, fmt.Errorf("policy %s rule %s: candidate calendar: %w", p.Name, r.Name, err)
				}
			}
			if err := r.Match.validPath(); err != nil {
				return nil, fmt.Errorf("policy %s rule %s: %w", p.Name, r.Name, err)
			}
			if err := r.validCost(); err != nil {
				return nil, fmt.Errorf("policy %s rule %s: cost: %w", p.Name, r.Name, err)
			}
			if err := validCalendar(r.Calendar, r.Algorithm, r.WindowMS); err != nil {
				return nil, fmt.Errorf("policy %s rule %s: calendar: %w", p.Name, r.Name, err)
			}
			if err := r.Durability.valid(); err != nil {
				return nil, fmt.Errorf("policy %s rule %s: durability: %w", p.Name, r.Name, err)
			}
		}
	}
	return &doc, nil
}

// Decompress returns the document of a GzipDataKey file, refusing one that expands beyond
// MaxDocumentBytes.
func Decompress(gz []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("decompressing %s: %w", GzipDataKey, err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("decompressing %s: %w", GzipDataKey, err)
	}
	if len(data) > MaxDocumentBytes {
		return nil, fmt.Errorf("decompressing %s: the document exceeds %d bytes", GzipDataKey, MaxDocumentBytes)
	}
	return data, nil
}

// Selects reports whether the policy targets a pod with these labels.
func (p *Policy) Selects(podLabels map[string]string) bool {
	return p.Selector.Matches(podLabels)
}

// validCalendar checks the calendar window cal (nil is valid) of a limit of algorithm and
// windowMS: its zone is one this build knows, its algorithm FixedWindow, and its window the
// longest period. A cost from the response is valid on one: holds count in its periods.
func validCalendar(cal *Calendar, algorithm string, windowMS int64) error {
	if cal == nil {
		return nil
	}
	if algorithm != "FixedWindow" {
		return errors.New("a calendar window is a FixedWindow")
	}
	c, err := calendar.New(cal.Spec())
	if err != nil {
		return err
	}
	if windowMS != c.MaxLength().Milliseconds() {
		return fmt.Errorf("windowMs %d, want the longest period, %d", windowMS, c.MaxLength().Milliseconds())
	}
	return nil
}

// validInFlight checks an in-flight rule: nothing of a limit per window goes with it.
func (r *Rule) validInFlight() error {
	switch {
	case r.InFlight < 1 || r.InFlight > MaxInFlight:
		return fmt.Errorf("inFlight %d not in 1..%d", r.InFlight, MaxInFlight)
	case r.Algorithm != "" || r.Requests != 0 || r.WindowMS != 0 || r.Burst != 0:
		return errors.New("inFlight with a limit per window")
	case r.Candidate != nil || r.Cost != nil || r.CountRefused || r.Durability != nil:
		return errors.New("inFlight with a candidate, a cost, countRefused or durability")
	case len(r.Key) == 0:
		return errors.New("no key")
	case r.Queue != nil && (r.Queue.Size < 1 || r.Queue.Size > MaxQueueSize):
		return fmt.Errorf("queue size %d not in 1..%d", r.Queue.Size, MaxQueueSize)
	case r.Queue != nil && (r.Queue.TimeoutMS < 1 || r.Queue.TimeoutMS > MaxQueueTimeoutMS):
		return fmt.Errorf("queue timeoutMs %d not in 1..%d", r.Queue.TimeoutMS, MaxQueueTimeoutMS)
	case r.OnSlotLost != "" && r.OnSlotLost != SlotLostFinish:
		return fmt.Errorf("onSlotLost %q: only %q is written (the default ends the request)", r.OnSlotLost, SlotLostFinish)
	}
	return r.Match.validPath()
}

// validPath checks the path fields of a match (nil is valid).
func (m *Match) validPath() error {
	switch {
	case m == nil:
		return nil
	case m.PathPrefix != "" && m.ExactPath != "":
		return errors.New("match sets both pathPrefix and exactPath")
	case m.PathPrefix != "" && !strings.HasPrefix(m.PathPrefix, "/"):
		return fmt.Errorf("match.pathPrefix %q does not start with /", m.PathPrefix)
	case m.ExactPath != "" && !strings.HasPrefix(m.ExactPath, "/"):
		return fmt.Errorf("match.exactPath %q does not start with /", m.ExactPath)
	case m.IgnoreCase && m.PathPrefix == "" && m.ExactPath == "":
		return errors.New("match.ignoreCase without a path")
	case m.IgnoreTrailingSlash && m.ExactPath == "":
		return errors.New("match.ignoreTrailingSlash without an exactPath")
	}
	return nil
}
