// Package rlptest builds RateLimitPolicies for the envtest suites, typed or as a user writes
// them (any field of any JSON type), so that the API suite and the controllers' suite send the
// API server the same objects.
package rlptest

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// Policy is a valid one-rule policy of ns selecting app=checkout: requests per minute on
// POST /api/, keyed by X-API-Key.
func Policy(ns, name string, requests int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "checkout"}},
			Rules: []v1alpha1.Rule{{
				Name:      "per-api-key",
				Match:     &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Value: "/api/"}, Methods: []v1alpha1.HTTPMethod{"POST"}},
				Key:       []v1alpha1.KeyPart{{Header: "X-API-Key"}},
				Algorithm: v1alpha1.SlidingWindowCounter,
				Limit:     v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
}

// RawPolicy is a policy as a user writes it, any field of any JSON type: one rule, selecting
// app=checkout.
func RawPolicy(ns, name string, rule map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "RateLimitPolicy",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"targetSelector": map[string]any{"matchLabels": map[string]any{"app": "checkout"}},
			"rules":          []any{rule},
		},
	}}
}

// RawRule is rule "r": 100 requests per window, keyed by X-API-Key.
func RawRule(window any) map[string]any {
	return map[string]any{
		"name":  "r",
		"key":   []any{map[string]any{"header": "X-API-Key"}},
		"limit": map[string]any{"requests": int64(100), "window": window},
	}
}

// PathPolicy is a one-rule policy (rule "r") with this match, as a user writes it.
func PathPolicy(ns, name string, match map[string]any) *unstructured.Unstructured {
	rule := RawRule("1m")
	rule["match"] = match
	return RawPolicy(ns, name, rule)
}

// PathValue is a match on path of this type ("" for the default) and value.
func PathValue(typ, value string) map[string]any {
	p := map[string]any{"value": value}
	if typ != "" {
		p["type"] = typ
	}
	return map[string]any{"path": p}
}
