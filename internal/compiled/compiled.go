// Package compiled turns the RateLimitPolicies of a namespace into the one canonical document
// that sidecars read (ConfigMap redline-policies, key policies.json), and reads it back.
//
// The document is deterministic: the same policies give the same bytes, whatever order the
// API server listed them in, so its content hash changes only when what is enforced changes.
package compiled

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// Names of the per-namespace ConfigMap.
const (
	ConfigMapName = "redline-policies"
	DataKey       = "policies.json"
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
	Name        string               `json:"name"`
	Generation  int64                `json:"generation"`
	Selector    metav1.LabelSelector `json:"selector"`
	FailureMode string               `json:"failureMode"`
	Rules       []Rule               `json:"rules"`
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
}

// Match restricts a rule to some requests.
type Match struct {
	PathPrefix string        `json:"pathPrefix,omitempty"`
	Methods    []string      `json:"methods,omitempty"`
	Headers    []HeaderMatch `json:"headers,omitempty"`
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

// CompilePolicy checks what the API server's schema cannot and compiles one policy. The error
// says what a person must change.
func CompilePolicy(p *v1alpha1.RateLimitPolicy) (Policy, error) {
	var errs []error
	sel := *p.Spec.TargetSelector.DeepCopy()
	if _, err := metav1.LabelSelectorAsSelector(&sel); err != nil {
		errs = append(errs, fmt.Errorf("spec.targetSelector: %w", err))
	}
	canonicalSelector(&sel)

	out := Policy{
		Name:        p.Name,
		Generation:  p.Generation,
		Selector:    sel,
		FailureMode: string(orDefault(p.Spec.FailureMode, v1alpha1.LocalFallback)),
	}
	seen := map[string]bool{}
	for i, r := range p.Spec.Rules {
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("spec.rules[%d].name: %q is used by an earlier rule", i, r.Name))
		}
		seen[r.Name] = true
		cr, err := compileRule(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("spec.rules[%d] (%s): %w", i, r.Name, err))
			continue
		}
		out.Rules = append(out.Rules, cr)
	}
	if len(p.Spec.Rules) == 0 {
		errs = append(errs, errors.New("spec.rules: at least one rule is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return Policy{}, err
	}
	return out, nil
}

func compileRule(r v1alpha1.Rule) (Rule, error) {
	alg := orDefault(r.Algorithm, v1alpha1.SlidingWindowCounter)
	window := r.Limit.Window.Duration
	switch {
	case r.Limit.Requests < 1:
		return Rule{}, errors.New("limit.requests must be at least 1")
	case window.Milliseconds() < 1000 || window.Hours() > 24:
		return Rule{}, fmt.Errorf("limit.window %s must be between 1s and 24h", window)
	case r.Limit.Burst != nil && alg != v1alpha1.TokenBucket:
		return Rule{}, errors.New("limit.burst is only valid with algorithm TokenBucket")
	case len(r.Key) == 0:
		return Rule{}, errors.New("key needs at least one part")
	}
	out := Rule{
		Name:      r.Name,
		Algorithm: string(alg),
		Requests:  r.Limit.Requests,
		WindowMS:  window.Milliseconds(),
		Mode:      string(orDefault(r.Mode, v1alpha1.Enforce)),
	}
	if alg == v1alpha1.TokenBucket {
		out.Burst = r.Limit.Requests
		if r.Limit.Burst != nil {
			out.Burst = *r.Limit.Burst
		}
	}
	for j, k := range r.Key {
		set := 0
		for _, s := range []string{k.Header, string(k.Attribute), k.Constant} {
			if s != "" {
				set++
			}
		}
		if set != 1 {
			return Rule{}, fmt.Errorf("key[%d] must set exactly one of header, attribute or constant", j)
		}
		out.Key = append(out.Key, KeyPart{Header: strings.ToLower(k.Header), Attribute: string(k.Attribute), Constant: k.Constant})
	}
	if m := r.Match; m != nil && (m.PathPrefix != "" || len(m.Methods) > 0 || len(m.Headers) > 0) {
		if m.PathPrefix != "" && !strings.HasPrefix(m.PathPrefix, "/") {
			return Rule{}, errors.New("match.pathPrefix must start with '/'")
		}
		cm := &Match{PathPrefix: m.PathPrefix}
		for _, meth := range m.Methods {
			cm.Methods = append(cm.Methods, string(meth))
		}
		slices.Sort(cm.Methods)
		cm.Methods = slices.Compact(cm.Methods)
		for _, h := range m.Headers {
			cm.Headers = append(cm.Headers, HeaderMatch{Name: strings.ToLower(h.Name), Value: h.Value})
		}
		slices.SortStableFunc(cm.Headers, func(a, b HeaderMatch) int { return strings.Compare(a.Name, b.Name) })
		out.Match = cm
	}
	return out, nil
}

// canonicalSelector sorts what the selector's meaning does not depend on, so equal selectors
// compile to equal bytes.
func canonicalSelector(s *metav1.LabelSelector) {
	for i := range s.MatchExpressions {
		slices.Sort(s.MatchExpressions[i].Values)
	}
	slices.SortStableFunc(s.MatchExpressions, func(a, b metav1.LabelSelectorRequirement) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(string(a.Operator), string(b.Operator))
	})
	if len(s.MatchLabels) == 0 {
		s.MatchLabels = nil
	}
	if len(s.MatchExpressions) == 0 {
		s.MatchExpressions = nil
	}
}

func orDefault[T ~string](v, def T) T {
	if v == "" {
		return def
	}
	return v
}

// Build assembles the document of a namespace from compiled policies and script SHAs, sorted
// and hashed. The input slice is not modified.
func Build(namespace string, policies []Policy, scripts map[string]string) (*Document, []byte, error) {
	doc := &Document{
		Version:   FormatVersion,
		Namespace: namespace,
		Scripts:   scripts,
		Policies:  slices.Clone(policies),
	}
	if doc.Policies == nil {
		doc.Policies = []Policy{}
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
		if _, err := metav1.LabelSelectorAsSelector(&p.Selector); err != nil {
			return nil, fmt.Errorf("policy %s: selector: %w", p.Name, err)
		}
		if len(p.Rules) == 0 {
			return nil, fmt.Errorf("policy %s has no rules", p.Name)
		}
		for _, r := range p.Rules {
			if r.Requests < 1 || r.WindowMS < 1000 || len(r.Key) == 0 {
				return nil, fmt.Errorf("policy %s rule %s: invalid limit or key", p.Name, r.Name)
			}
		}
	}
	return &doc, nil
}

// Selects reports whether the policy targets a pod with these labels.
func (p *Policy) Selects(podLabels map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(&p.Selector)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(podLabels))
}
