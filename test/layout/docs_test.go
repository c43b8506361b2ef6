package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docsLayout is the page whose Layout table names every package's one job.
const docsLayout = "docs/development.md"

// TestEveryPackageIsInTheLayoutTable holds the Layout table of docs/development.md to the tree:
// every directory holding Go files is named in it, itself or by a folder above it (a row for
// `hack/` covers its programs), so a package added without a line saying its job fails here.
func TestEveryPackageIsInTheLayoutTable(t *testing.T) {
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, docsLayout))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(page), "\n## Layout\n")
	if !ok {
		t.Fatalf("%s has no Layout section", docsLayout)
	}
	if end := strings.Index(table, "\n## "); end >= 0 {
		table = table[:end]
	}
	named := map[string]bool{}
	folder := regexp.MustCompile("`([a-z0-9_./-]+?)/?(?:\\.\\.\\.)?`")
	for line := range strings.SplitSeq(table, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		for _, m := range folder.FindAllStringSubmatch(first, -1) { // the row's folder column
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	dirs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range dirs {
		covered := false
		for p := dir; p != "." && p != "" && !covered; p = filepath.ToSlash(filepath.Dir(p)) {
			covered = named[p]
		}
		if !covered {
			t.Errorf("%s is not in the Layout table of %s: add a row saying its one job", dir, docsLayout)
		}
	}
}
