package ruleset

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/redline-dev/redline/internal/policydoc"
)

// Store holds the rule set in force. Readers take it with Current on every request; the
// loader swaps in a new one atomically, so a request sees either the old set or the new one,
// never a mix, and none waits for a reload.
type Store struct {
	set    atomic.Pointer[Set]
	status atomic.Pointer[string]
}

// Current returns the set in force, or nil before the first valid document.
func (s *Store) Current() *Set { return s.set.Load() }

// Ready reports whether a valid set is in force and, if not, why.
func (s *Store) Ready() (bool, string) {
	if s.set.Load() != nil {
		return true, ""
	}
	if r := s.status.Load(); r != nil {
		return false, *r
	}
	return false, "policies not loaded yet"
}

func (s *Store) notReady(reason string) { s.status.Store(&reason) }

// Swap puts set in force; the Loader does this, and tests and tools that build sets themselves.
func (s *Store) Swap(set *Set) { s.set.Store(set) }

// Loader reads the policies document and the pod labels, builds the set and puts it in Store,
// again whenever the mounted files change.
type Loader struct {
	// Dir is the mounted ConfigMap directory; the document is policydoc.DataKey inside it.
	Dir string
	// LabelsFile is the downward API labels file ("" for no labels).
	LabelsFile string
	Builder    *Builder
	Store      *Store
	Log        *slog.Logger
	// Resync is how often files are read again even without a change event, in case one was
	// missed (default 10s). Unchanged content costs a read and a hash.
	Resync time.Duration
	// OnLoad, if set, hears of each new set in force.
	OnLoad func(*Set)
	// OnError, if set, hears of each refused document or labels file (once per distinct content).
	OnError func(error)

	lastInput [sha256.Size]byte // document and labels of the set in force
	lastBad   [sha256.Size]byte // document and labels last refused
}

// Path is the document's path.
func (l *Loader) Path() string { return filepath.Join(l.Dir, policydoc.DataKey) }

// Load reads the files once and swaps in a new set when they changed and are valid. A refused
// document leaves the set in force as it is.
func (l *Loader) Load() error {
	data, err := l.readDocument()
	absent := errors.Is(err, fs.ErrNotExist)
	if err != nil && !absent {
		return l.refuse(nil, fmt.Errorf("reading policies document: %w", err))
	}
	var labelData []byte
	if l.LabelsFile != "" {
		if labelData, err = os.ReadFile(l.LabelsFile); err != nil {
			return l.refuse(nil, fmt.Errorf("reading pod labels: %w", err))
		}
	}
	h := sha256.New()
	h.Write(data)
	h.Write([]byte{0})
	h.Write(labelData)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if sum == l.lastInput && l.Store.Current() != nil {
		return nil
	}
	if sum == l.lastBad {
		return nil // refused before; counted and logged once
	}
	labels, err := ParseLabels(labelData)
	if err != nil {
		return l.refuse(&sum, fmt.Errorf("parsing pod labels %s: %w", l.LabelsFile, err))
	}
	// No document is a valid state: the ConfigMap is optional in the pod spec and exists only
	// while the namespace has policies, so its absence means "nothing to enforce", both before
	// the first policy and after the last one is deleted. A document that is present must be
	// valid.
	doc := &policydoc.Document{Version: policydoc.FormatVersion, Namespace: l.Builder.Namespace}
	if !absent {
		if doc, err = policydoc.Parse(data); err != nil {
			return l.refuse(&sum, fmt.Errorf("loading %s: %w", l.Path(), err))
		}
	}
	set, err := l.Builder.Build(doc, labels)
	if err != nil {
		return l.refuse(&sum, fmt.Errorf("building rules from %s: %w", l.Path(), err))
	}
	prev := l.Store.Current()
	l.Store.Swap(set)
	l.lastInput, l.lastBad = sum, [sha256.Size]byte{}
	args := []any{"hash", set.Hash, "namespace", set.Namespace, "policies", set.PolicyNames(),
		"rules", len(set.Rules), "documentPolicies", set.Total}
	if prev != nil {
		args = append(args, "previousHash", prev.Hash)
	}
	l.Log.Info("policies loaded", args...)
	if l.OnLoad != nil {
		l.OnLoad(set)
	}
	return nil
}

// readDocument reads the document: gzip-compressed when the controller had to compress it to
// fit the ConfigMap (policydoc.GzipDataKey), plain otherwise.
func (l *Loader) readDocument() ([]byte, error) {
	gz, err := os.ReadFile(filepath.Join(l.Dir, policydoc.GzipDataKey))
	if errors.Is(err, fs.ErrNotExist) {
		return os.ReadFile(l.Path())
	}
	if err != nil {
		return nil, err
	}
	return policydoc.Decompress(gz)
}

func (l *Loader) refuse(sum *[sha256.Size]byte, err error) error {
	if sum != nil {
		l.lastBad = *sum
	}
	if cur := l.Store.Current(); cur != nil {
		l.Log.Error("policies document refused, keeping the set in force", "error", err, "path", l.Path(), "hashInForce", cur.Hash)
	} else {
		l.Store.notReady(err.Error())
		l.Log.Error("policies document refused, no valid set loaded", "error", err, "path", l.Path())
	}
	if l.OnError != nil {
		l.OnError(err)
	}
	return err
}

// Run watches the document's directory and the labels file's directory and reloads on every
// change until ctx ends. Kubelet updates a mounted ConfigMap by swapping a "..data" symlink
// inside the directory, so the directory is watched, not the file.
func (l *Loader) Run(ctx context.Context) error {
	resync := l.Resync
	if resync <= 0 {
		resync = 10 * time.Second
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("creating file watcher: %w", err)
	}
	defer w.Close()
	dirs := []string{l.Dir}
	if l.LabelsFile != "" {
		dirs = append(dirs, filepath.Dir(l.LabelsFile))
	}
	watched := map[string]bool{}
	watch := func() {
		for _, d := range dirs {
			if watched[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				l.Log.Warn("cannot watch directory yet, polling", "dir", d, "error", err, "every", resync.String())
				continue
			}
			watched[d] = true
		}
	}
	watch()
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("file watcher closed")
			}
			if ev.Has(fsnotify.Remove) && watched[ev.Name] {
				delete(watched, ev.Name) // the directory itself went away
			}
			_ = l.Load() // errors are logged and counted by Load
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("file watcher closed")
			}
			l.Log.Warn("file watcher error", "error", err)
		case <-tick.C:
			watch()
			_ = l.Load()
		}
	}
}
