// Package kubeletdir writes directories the way kubelet writes ConfigMap and downward-API
// volumes, so tests and local stacks exercise the same file swaps a pod sees.
package kubeletdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

var payloadSeq atomic.Int64

// Write makes dir hold exactly files, the way kubelet updates a ConfigMap or downward-API
// volume: the files go into a new hidden timestamped directory, a "..data_tmp" symlink to it is
// renamed over "..data" (one atomic step for readers), each visible name is a symlink through
// "..data", names no longer in the payload are removed, and the old directory is deleted.
func Write(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating volume directory %s: %w", dir, err)
	}
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), payloadSeq.Add(1))
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
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing volume directory: %w", err)
	}
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), "..") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
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
