package docs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// TestLinks: every relative link and image of README.md, CHANGELOG.md, docs/ and results/
// names a file or folder of the repository, and every #anchor a heading of the page it points
// to (GitHub's anchors, see slug). Links with a scheme (https:, mailto:) are not followed.
func TestLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := readPage(t, rel).anchors()
		anchors[rel] = a
		return a
	}
	for _, file := range checkedFiles(t) {
		for _, l := range readPage(t, file).links() {
			if err := checkLink(file, l.dest, anchorsOf); err != nil {
				t.Errorf("%s:%d: link %q: %v", file, l.line, l.dest, err)
			}
		}
	}
}

// checkLink resolves one destination of file (relative to the root).
func checkLink(file, dest string, anchorsOf func(string) map[string]bool) error {
	u, err := url.Parse(dest)
	if err != nil {
		return fmt.Errorf("does not parse: %w", err)
	}
	if u.Scheme != "" || u.Host != "" {
		return nil
	}
	target := file
	if u.Path != "" {
		if strings.HasPrefix(u.Path, "/") {
			return errors.New("an absolute path: write it relative to the page")
		}
		target = path.Clean(path.Join(path.Dir(file), u.Path))
		if target == ".." || strings.HasPrefix(target, "../") {
			return errors.New("points outside the repository")
		}
	}
	info, err := os.Stat(filepath.Join(root, filepath.FromSlash(target)))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist", target)
	case err != nil:
		return err
	}
	if u.Fragment == "" {
		return nil
	}
	if info.IsDir() || !strings.HasSuffix(target, ".md") {
		return fmt.Errorf("#%s on %s, which is not a Markdown page", u.Fragment, target)
	}
	if !anchorsOf(target)[u.Fragment] {
		return fmt.Errorf("%s has no heading whose anchor is #%s", target, u.Fragment)
	}
	return nil
}

// TestLinkCheckerFindsBrokenLinks: the checker refuses what it must, on pages written here.
func TestLinkCheckerFindsBrokenLinks(t *testing.T) {
	anchorsOf := func(rel string) map[string]bool {
		if rel == "docs/README.md" {
			return map[string]bool{"install": true}
		}
		return readPage(t, rel).anchors()
	}
	for _, c := range []struct {
		file, dest string
		ok         bool
	}{
		{"docs/README.md", "getting-started.md", true},
		{"docs/README.md", "../README.md#documentation", true},
		{"docs/README.md", "#install", true},
		{"docs/README.md", "https://example.com/nowhere", true},
		{"docs/README.md", "reference/api.md", true}, // allowed while missing
		{"docs/README.md", "no-such-page.md", false},
		{"docs/README.md", "#no-such-heading", false},
		{"docs/README.md", "../README.md#no-such-heading", false},
		{"docs/README.md", "/docs/README.md", false},
		{"docs/README.md", "../../elsewhere.md", false},
		{"README.md", "config/samples", true},
		{"README.md", "config/samples#x", false},
	} {
		err := checkLink(c.file, c.dest, anchorsOf)
		if (err == nil) != c.ok {
			t.Errorf("%s -> %q: error %v, want ok=%v", c.file, c.dest, err, c.ok)
		}
	}
}

// TestIndexesLinkEveryPage: README.md (the front door) and docs/README.md (the manual's
// index) each link every page of docs/, so no page is found only by browsing the folder.
func TestIndexesLinkEveryPage(t *testing.T) {
	var pages []string
	for _, f := range checkedFiles(t) {
		if strings.HasPrefix(f, "docs/") {
			pages = append(pages, f)
		}
	}
	for _, index := range []string{"README.md", "docs/README.md"} {
		linked := map[string]bool{index: true}
		for _, l := range readPage(t, index).links() {
			u, err := url.Parse(l.dest)
			if err != nil || u.Scheme != "" || u.Path == "" {
				continue
			}
			linked[path.Clean(path.Join(path.Dir(index), u.Path))] = true
		}
		for _, p := range pages {
			if !linked[p] {
				t.Errorf("%s does not link %s", index, p)
			}
		}
	}
}
