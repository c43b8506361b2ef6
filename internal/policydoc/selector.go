package policydoc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Selector is a label selector, with the JSON shape of Kubernetes' metav1.LabelSelector. It is
// its own type so that sidecars read documents without linking Kubernetes' libraries (which
// would cost them megabytes of resident memory).
type Selector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Requirement is one expression of a Selector.
type Requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// The operators of a Requirement.
const (
	OpIn           = "In"
	OpNotIn        = "NotIn"
	OpExists       = "Exists"
	OpDoesNotExist = "DoesNotExist"
)

// Validate checks the selector the way the API server checks Deployment selectors.
func (s *Selector) Validate() error {
	var errs []error
	for i, r := range s.MatchExpressions {
		switch r.Operator {
		case OpIn, OpNotIn:
			if len(r.Values) == 0 {
				errs = append(errs, fmt.Errorf("matchExpressions[%d]: operator %s needs at least one value", i, r.Operator))
			}
		case OpExists, OpDoesNotExist:
			if len(r.Values) > 0 {
				errs = append(errs, fmt.Errorf("matchExpressions[%d]: operator %s takes no values", i, r.Operator))
			}
		default:
			errs = append(errs, fmt.Errorf("matchExpressions[%d]: unknown operator %q (In, NotIn, Exists, DoesNotExist)", i, r.Operator))
		}
		if r.Key == "" {
			errs = append(errs, fmt.Errorf("matchExpressions[%d]: key is empty", i))
		}
	}
	for k := range s.MatchLabels {
		if k == "" {
			errs = append(errs, errors.New("matchLabels: empty key"))
		}
	}
	return errors.Join(errs...)
}

// Matches reports whether labels satisfy the selector. An empty selector matches everything;
// an invalid one matches nothing.
func (s *Selector) Matches(labels map[string]string) bool {
	if s.Validate() != nil {
		return false
	}
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		v, ok := labels[r.Key]
		switch r.Operator {
		case OpIn:
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case OpNotIn:
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case OpExists:
			if !ok {
				return false
			}
		case OpDoesNotExist:
			if ok {
				return false
			}
		}
	}
	return true
}

// canonical sorts what the selector's meaning does not depend on, so equal selectors compile
// to equal bytes.
func (s *Selector) canonical() {
	for i := range s.MatchExpressions {
		s.MatchExpressions[i].Values = slices.Clone(s.MatchExpressions[i].Values)
		slices.Sort(s.MatchExpressions[i].Values)
		s.MatchExpressions[i].Values = slices.Compact(s.MatchExpressions[i].Values)
	}
	slices.SortStableFunc(s.MatchExpressions, func(a, b Requirement) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(a.Operator, b.Operator)
	})
	if len(s.MatchLabels) == 0 {
		s.MatchLabels = nil
	}
	if len(s.MatchExpressions) == 0 {
		s.MatchExpressions = nil
	}
}
