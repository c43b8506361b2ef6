// Package apiwarn records the warnings an API server returns (admission warnings among them),
// for tests that assert what `kubectl` would print.
package apiwarn

import "sync"

// Recorder is a rest.WarningHandler that keeps every warning until Take. Safe for concurrent
// use; the zero value is ready.
type Recorder struct {
	mu   sync.Mutex
	msgs []string
}

// HandleWarningHeader records msg.
func (w *Recorder) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

// Take returns the warnings recorded since the last call.
func (w *Recorder) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}
