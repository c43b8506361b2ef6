// Package sidecartest has helpers for the sidecar's tests: policy documents.
package sidecartest

import (
	"fmt"
	"time"

	"github.com/redline-dev/redline/internal/compiled"
)

// Document returns the bytes of a valid policies document of namespace with one policy named
// policy selecting app=<app> and one rule named rule: requests per window by SlidingWindowLog
// (exact), keyed on header keyHeader, enforced, with failure mode mode.
func Document(namespace, policy, rule, app string, requests int64, window time.Duration, keyHeader, mode string) []byte {
	return DocumentAlgorithm(namespace, policy, rule, app, requests, window, keyHeader, mode, "SlidingWindowLog")
}

// DocumentAlgorithm is Document with another algorithm.
func DocumentAlgorithm(namespace, policy, rule, app string, requests int64, window time.Duration, keyHeader, mode, algorithm string) []byte {
	p := compiled.Policy{
		Name:        policy,
		Generation:  1,
		Selector:    compiled.Selector{MatchLabels: map[string]string{"app": app}},
		FailureMode: mode,
		Rules: []compiled.Rule{{
			Name: rule, Key: []compiled.KeyPart{{Header: keyHeader}}, Algorithm: algorithm,
			Requests: requests, WindowMS: window.Milliseconds(), Mode: "Enforce",
		}},
	}
	_, data, err := compiled.Build(namespace, []compiled.Policy{p}, map[string]string{})
	if err != nil {
		panic(fmt.Sprintf("building test document: %v", err))
	}
	return data
}
