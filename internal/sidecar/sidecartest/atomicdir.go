// Package sidecartest has helpers for the sidecar's tests: a writer that updates a directory
// the way kubelet updates a mounted ConfigMap, and policy documents.
package sidecartest

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/compiled"
)

var seq atomic.Int64

// WriteAtomic writes files into dir as kubelet's atomic writer does: into a new timestamped
// directory, then a "..data_tmp" symlink to it renamed over "..data", with each file a symlink
// through "..data". The previous timestamped directory is removed afterwards.
func WriteAtomic(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), seq.Add(1))
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return fmt.Errorf("creating payload directory: %w", err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), data, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		return fmt.Errorf("linking ..data_tmp: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return fmt.Errorf("swapping ..data: %w", err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return fmt.Errorf("linking %s: %w", name, err)
		}
	}
	if old != "" && old != ts {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

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
