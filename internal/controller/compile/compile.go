package compile

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/policydoc"
)

// Policy checks what the API server's schema cannot (label selectors, among others) and
// compiles one policy into the document's form. The error
// says what a person must change.
func Policy(p *v1alpha1.RateLimitPolicy) (policydoc.Policy, error) {
	var errs []error
	sel := policydoc.Selector{MatchLabels: p.Spec.TargetSelector.MatchLabels}
	for _, e := range p.Spec.TargetSelector.MatchExpressions {
		sel.MatchExpressions = append(sel.MatchExpressions, policydoc.Requirement{
			Key: e.Key, Operator: string(e.Operator), Values: slices.Clone(e.Values),
		})
	}
	if err := sel.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("spec.targetSelector: %w", err))
	}

	out := policydoc.Policy{
		Name:        p.Name,
		Generation:  p.Generation,
		Selector:    sel,
		FailureMode: string(orDefault(p.Spec.FailureMode, v1alpha1.FailureModeLocalFallback)),
		// Always is the default, so a spec without the field compiles to the same bytes.
		HeadersOnRefusal: p.Spec.RateLimitHeaders == v1alpha1.HeadersOnRefusal,
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
		return policydoc.Policy{}, err
	}
	return out, nil
}

func compileRule(r v1alpha1.Rule) (policydoc.Rule, error) {
	compileLimit := compileWindowLimit
	if r.Limit.InFlight != nil {
		compileLimit = compileInFlight
	}
	out, err := compileLimit(r)
	if err != nil {
		return policydoc.Rule{}, err
	}
	if out.Durability, err = compileDurability(r); err != nil {
		return policydoc.Rule{}, err
	}
	switch r.TopKeys {
	case "", v1alpha1.TopKeysHashes, v1alpha1.TopKeysValues:
	default:
		return policydoc.Rule{}, fmt.Errorf("topKeys %q must be Hashes or Values", r.TopKeys)
	}
	if len(r.Key) == 0 {
		return policydoc.Rule{}, errors.New("key needs at least one part")
	}
	for j, k := range r.Key {
		set := 0
		for _, s := range []string{k.Header, string(k.Attribute), k.Constant} {
			if s != "" {
				set++
			}
		}
		if set != 1 {
			return policydoc.Rule{}, fmt.Errorf("key[%d] must set exactly one of header, attribute or constant", j)
		}
		out.Key = append(out.Key, policydoc.KeyPart{Header: strings.ToLower(k.Header), Attribute: string(k.Attribute), Constant: k.Constant})
	}
	if m := r.Match; m != nil && (m.Path != nil || m.PathPrefix != "" || len(m.Methods) > 0 || len(m.Headers) > 0) {
		cm, err := compilePath(m)
		if err != nil {
			return policydoc.Rule{}, err
		}
		for _, meth := range m.Methods {
			cm.Methods = append(cm.Methods, string(meth))
		}
		slices.Sort(cm.Methods)
		cm.Methods = slices.Compact(cm.Methods)
		for _, h := range m.Headers {
			cm.Headers = append(cm.Headers, policydoc.HeaderMatch{Name: strings.ToLower(h.Name), Value: h.Value})
		}
		slices.SortStableFunc(cm.Headers, func(a, b policydoc.HeaderMatch) int { return strings.Compare(a.Name, b.Name) })
		out.Match = cm
	}
	return out, nil
}

// compileWindowLimit compiles the limit of a rule counted per window: its algorithm, limit,
// candidate, cost and what it does with refused requests.
func compileWindowLimit(r v1alpha1.Rule) (policydoc.Rule, error) {
	alg := orDefault(r.Algorithm, v1alpha1.SlidingWindowCounter)
	burst, err := checkLimit(alg, r.Limit, "limit")
	if err != nil {
		return policydoc.Rule{}, err
	}
	out := policydoc.Rule{
		Name:         r.Name,
		Algorithm:    string(alg),
		Requests:     r.Limit.Requests,
		WindowMS:     r.Limit.Window.Milliseconds(),
		Burst:        burst,
		Mode:         string(orDefault(r.Mode, v1alpha1.Enforce)),
		ReportValues: r.TopKeys == v1alpha1.TopKeysValues,
	}
	switch r.Refused {
	case "", v1alpha1.RefusedUncounted:
	case v1alpha1.RefusedCounted:
		out.CountRefused = true
	default:
		return policydoc.Rule{}, fmt.Errorf("refused %q must be Uncounted or Counted", r.Refused)
	}
	if r.Limit.Calendar != nil {
		if out.Calendar, out.WindowMS, err = compileCalendar(alg, r.Limit.Calendar); err != nil {
			return policydoc.Rule{}, err
		}
	}
	if c := r.Candidate; c != nil {
		calg := orDefault(c.Algorithm, alg)
		cburst, err := checkLimit(calg, c.Limit, "candidate.limit")
		if err != nil {
			return policydoc.Rule{}, err
		}
		out.Candidate = &policydoc.Candidate{Algorithm: string(calg), Requests: c.Limit.Requests, WindowMS: c.Limit.Window.Milliseconds(), Burst: cburst}
		if c.Limit.Calendar != nil {
			if out.Candidate.Calendar, out.Candidate.WindowMS, err = compileCalendar(calg, c.Limit.Calendar); err != nil {
				return policydoc.Rule{}, fmt.Errorf("candidate.%w", err)
			}
		}
	}
	if out.Cost, err = compileCost(r.Cost, &out); err != nil {
		return policydoc.Rule{}, err
	}
	return out, nil
}

// checkLimit checks a limit of algorithm alg (named field in errors) and returns the burst the
// document carries: a TokenBucket's (requests when not set), 0 for the other algorithms. The
// schema enforces these bounds too; objects stored before a bound existed meet them here.
func checkLimit(alg v1alpha1.Algorithm, l v1alpha1.Limit, field string) (int64, error) {
	if l.InFlight != nil {
		return 0, fmt.Errorf("%s.inFlight is not supported here: a %s is requests per window (requests and window)", field, field)
	}
	window := l.Window.Duration
	if l.Calendar != nil && window == 0 {
		window = v1alpha1.MinWindow // checked by compileCalendar instead
	}
	maxWindow := v1alpha1.MaxWindow
	if alg == v1alpha1.SlidingWindowCounter {
		maxWindow = v1alpha1.MaxRollingWindow
	}
	maxRequests := int64(v1alpha1.MaxRequests)
	if alg == v1alpha1.SlidingWindowLog {
		maxRequests = v1alpha1.MaxSlidingWindowLogRequests
	}
	switch {
	case l.Requests < 1 || l.Requests > maxRequests:
		return 0, fmt.Errorf("%s.requests must be between 1 and %d with algorithm %s", field, maxRequests, alg)
	case l.Calendar != nil && l.Window.Duration != 0:
		return 0, fmt.Errorf("%s sets either window or calendar, not both", field)
	case window < v1alpha1.MinWindow || window > maxWindow:
		return 0, fmt.Errorf("%s.window %s must be between 1s and 24h, or 744h (31 days) with algorithm SlidingWindowCounter (the rule's is %s)", field, window, alg)
	case l.Burst != nil && (*l.Burst < 1 || *l.Burst > v1alpha1.MaxRequests):
		return 0, fmt.Errorf("%s.burst must be between 1 and %d", field, v1alpha1.MaxRequests)
	case l.Burst != nil && alg != v1alpha1.TokenBucket:
		return 0, fmt.Errorf("%s.burst is only valid with algorithm TokenBucket", field)
	}
	if alg != v1alpha1.TokenBucket {
		return 0, nil
	}
	if l.Burst != nil {
		return *l.Burst, nil
	}
	return l.Requests, nil
}

func orDefault[T ~string](v, def T) T {
	if v == "" {
		return def
	}
	return v
}

// compilePath compiles a match's path into the document's form, decoded as the sidecar
// compares it. Both API forms of a prefix compile to pathPrefix, the field every sidecar
// release reads (see policydoc.Match). It checks again what the schema checks, for objects
// stored before the schema did, and what the schema cannot see (encoded dot segments).
func compilePath(m *v1alpha1.RuleMatch) (*policydoc.Match, error) {
	switch {
	case m.Path != nil && m.PathPrefix != "":
		return nil, errors.New("match.path and match.pathPrefix are mutually exclusive: keep match.path (pathPrefix is deprecated)")
	case m.PathPrefix != "":
		// pathPrefix was always compared as written, with the decoded path: kept so.
		if !strings.HasPrefix(m.PathPrefix, "/") || len(m.PathPrefix) > v1alpha1.MaxPathLength {
			return nil, fmt.Errorf("match.pathPrefix must start with '/' and be at most %d characters", v1alpha1.MaxPathLength)
		}
		return &policydoc.Match{PathPrefix: m.PathPrefix}, nil
	case m.Path == nil:
		return &policydoc.Match{}, nil
	}
	v := m.Path.Value
	if !strings.HasPrefix(v, "/") || len(v) > v1alpha1.MaxPathLength {
		return nil, fmt.Errorf("match.path.value must start with '/' and be at most %d characters", v1alpha1.MaxPathLength)
	}
	decoded, err := url.PathUnescape(v)
	if err != nil {
		return nil, fmt.Errorf("match.path.value %q: every %% must start an escape of two hex digits: %w", v, err)
	}
	// Requests are matched in normal form: segments that normal form never has would make a
	// rule that can never match, which is a mistake to report, not a rule to keep.
	if strings.Contains(decoded, "\\") || strings.Count(decoded, "/") != strings.Count(v, "/") {
		return nil, fmt.Errorf("match.path.value %q must not contain an encoded slash or a backslash: the sidecar refuses such requests", v)
	}
	for seg := range strings.SplitSeq(decoded[1:], "/") {
		if seg == "." || seg == ".." {
			return nil, fmt.Errorf("match.path.value %q must not contain a '.' or '..' segment, encoded or not: request paths are matched with dot segments removed", v)
		}
	}
	if strings.Contains(decoded, "//") {
		return nil, fmt.Errorf("match.path.value %q must not contain '//': request paths are matched with runs of slashes merged", v)
	}
	typ := orDefault(m.Path.Type, v1alpha1.PathMatchPathPrefix)
	switch orDefault(m.Path.TrailingSlash, v1alpha1.TrailingSlashStrict) {
	case v1alpha1.TrailingSlashStrict:
	case v1alpha1.TrailingSlashIgnore:
		if typ != v1alpha1.PathMatchExact {
			return nil, errors.New("match.path.trailingSlash: Ignore needs type: Exact (a PathPrefix match always ignores a trailing slash)")
		}
	default:
		return nil, fmt.Errorf("match.path.trailingSlash %q must be Strict or Ignore", m.Path.TrailingSlash)
	}
	switch typ {
	case v1alpha1.PathMatchPathPrefix:
		return &policydoc.Match{PathPrefix: decoded, IgnoreCase: m.Path.IgnoreCase}, nil
	case v1alpha1.PathMatchExact:
		return &policydoc.Match{ExactPath: decoded, IgnoreCase: m.Path.IgnoreCase,
			IgnoreTrailingSlash: m.Path.TrailingSlash == v1alpha1.TrailingSlashIgnore}, nil
	default:
		return nil, fmt.Errorf("match.path.type %q must be PathPrefix or Exact", m.Path.Type)
	}
}

// compileCalendar compiles a calendar window, loading its zone from the zone data the binaries
// embed: the schema cannot tell a zone name from a made-up one, so an unknown zone stops here,
// in the policy's status, and never reaches a sidecar (which would refuse the document).
func compileCalendar(alg v1alpha1.Algorithm, c *v1alpha1.CalendarWindow) (*policydoc.Calendar, int64, error) {
	if alg != v1alpha1.FixedWindow {
		return nil, 0, fmt.Errorf("limit.calendar needs algorithm FixedWindow, not %s", alg)
	}
	out := &policydoc.Calendar{Unit: string(c.Unit), BillingDay: int(c.BillingDay)}
	if c.TimeZone != "UTC" {
		out.Zone = c.TimeZone
	}
	if c.Unit == v1alpha1.CalendarWeek {
		out.FirstWeekday = int(time.Monday)
		if c.FirstWeekday != "" {
			d, ok := weekdays[c.FirstWeekday]
			if !ok {
				return nil, 0, fmt.Errorf("limit.calendar.firstWeekday %q is not a day of the week", c.FirstWeekday)
			}
			out.FirstWeekday = int(d)
		}
	}
	cal, err := calendar.New(out.Spec())
	if err != nil {
		return nil, 0, fmt.Errorf("limit.calendar: %w", err)
	}
	return out, cal.MaxLength().Milliseconds(), nil
}

var weekdays = map[v1alpha1.Weekday]time.Weekday{
	"Sunday": time.Sunday, "Monday": time.Monday, "Tuesday": time.Tuesday, "Wednesday": time.Wednesday,
	"Thursday": time.Thursday, "Friday": time.Friday, "Saturday": time.Saturday,
}
