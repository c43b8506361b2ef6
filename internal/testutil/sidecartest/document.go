// Package sidecartest has helpers for the sidecar's tests: policy documents.
package sidecartest

import (
	"testing"

	"fmt"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/ruleset"

	"github.com/redline-dev/redline/internal/policydoc"
)

// labelApp is the pod label the test documents select on.
const labelApp = "app"

// Document returns the bytes of a valid policies document of namespace with one policy named
// policy selecting app=<app> and one rule named rule: requests per window by SlidingWindowLog
// (exact), keyed on header keyHeader, enforced, with failure mode mode.
func Document(namespace, policy, rule, app string, requests int64, window time.Duration, keyHeader, mode string) []byte {
	return DocumentAlgorithm(namespace, policy, rule, app, requests, window, keyHeader, mode, "SlidingWindowLog")
}

// DocumentAlgorithm is Document with another algorithm.
func DocumentAlgorithm(namespace, policy, rule, app string, requests int64, window time.Duration, keyHeader, mode, algorithm string) []byte {
	p := policydoc.Policy{
		Name:        policy,
		Generation:  1,
		Selector:    policydoc.Selector{MatchLabels: map[string]string{labelApp: app}},
		FailureMode: mode,
		Rules: []policydoc.Rule{{
			Name: rule, Key: []policydoc.KeyPart{{Header: keyHeader}}, Algorithm: algorithm,
			Requests: requests, WindowMS: window.Milliseconds(), Mode: modeEnforce,
		}},
	}
	_, data, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		panic(fmt.Sprintf("building test document: %v", err))
	}
	return data
}

// Store returns a store holding the rule set of a Document (namespace "ns", policy "p", rule
// "r", app=web, limit requests per window, keyed on X-Key, failing open), as a pod labelled
// app=web would load it.
func Store(t testing.TB, requests int64, window time.Duration) *ruleset.Store {
	t.Helper()
	doc, err := policydoc.Parse(Document("ns", "p", "r", "web", requests, window, "x-key", "Open"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(doc, map[string]string{labelApp: "web"})
	if err != nil {
		t.Fatal(err)
	}
	store := &ruleset.Store{}
	store.Swap(set)
	return store
}

// DocumentPathPrefix is Document (FixedWindow, failing open) with the rule restricted to paths
// under pathPrefix.
func DocumentPathPrefix(namespace, policy, rule, app string, requests int64, window time.Duration, keyHeader, pathPrefix string) []byte {
	p := policydoc.Policy{
		Name: policy, Generation: 1, FailureMode: "Open",
		Selector: policydoc.Selector{MatchLabels: map[string]string{labelApp: app}},
		Rules: []policydoc.Rule{{
			Name: rule, Match: &policydoc.Match{PathPrefix: pathPrefix}, Key: []policydoc.KeyPart{{Header: keyHeader}},
			Algorithm: "FixedWindow", Requests: requests, WindowMS: window.Milliseconds(), Mode: modeEnforce,
		}},
	}
	_, data, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		panic(fmt.Sprintf("building test document: %v", err))
	}
	return data
}

// StoreOf returns a store holding the rule set of doc as a pod labelled app=web loads it.
func StoreOf(t testing.TB, doc []byte) *ruleset.Store {
	t.Helper()
	parsed, err := policydoc.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(parsed, map[string]string{labelApp: "web"})
	if err != nil {
		t.Fatal(err)
	}
	store := &ruleset.Store{}
	store.Swap(set)
	return store
}

// DocumentRules returns the bytes of a valid policies document of namespace with one policy
// named policy selecting app=<app>, failing open, with these rules.
func DocumentRules(namespace, policy, app string, rules ...policydoc.Rule) []byte {
	p := policydoc.Policy{
		Name: policy, Generation: 1, FailureMode: "Open",
		Selector: policydoc.Selector{MatchLabels: map[string]string{labelApp: app}},
		Rules:    rules,
	}
	_, data, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		panic(fmt.Sprintf("building test document: %v", err))
	}
	return data
}
