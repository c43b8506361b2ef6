// Package layout holds the repository to its rooms: a Go file over maxLines lines holds more
// than one job and is split along them.
package layout

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxLines is the most lines a .go file of the repository may have. STYLE.md: a file over
// about 500 lines is a sign to split.
const maxLines = 500

// allowed are files over maxLines that another branch splits; each goes when it does.
var allowed = map[string]string{}

func TestNoGoFileOverMaxLines(t *testing.T) {
	root := repoRoot(t)
	long, err := longFiles(root, maxLines)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range long {
		if _, ok := allowed[f.path]; ok {
			continue
		}
		t.Errorf("%s has %d lines, more than %d: split it along the jobs it holds", f.path, f.lines, maxLines)
	}
	for path := range allowed {
		if !slices.ContainsFunc(long, func(f longFile) bool { return f.path == path }) {
			t.Errorf("%s is allowed over %d lines but is not (any more): remove it from allowed", path, maxLines)
		}
	}
}

// TestLongFilesFindsEveryModule checks the walk itself on a tree made for it: a long file in
// a nested module is found, generated files and bin/ are not, and a file at the bound passes.
func TestLongFilesFindsEveryModule(t *testing.T) {
	dir := t.TempDir()
	write := func(path string, lines int) {
		t.Helper()
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte("//\n"), lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", 1)
	write("a/at_bound.go", 10)
	write("a/over.go", 11)
	write("hack/tool/go.mod", 1)
	write("hack/tool/over_test.go", 12)
	write("api/zz_generated.deepcopy.go", 50)
	write("bin/tool/over.go", 50)
	write("a/notgo.txt", 50)
	got, err := longFiles(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []longFile{{"a/over.go", 11}, {"hack/tool/over_test.go", 12}}
	if !slices.Equal(got, want) {
		t.Errorf("longFiles = %v, want %v", got, want)
	}
}

type longFile struct {
	path  string // slash-separated, relative to the repository's root
	lines int
}

// longFiles are the .go files under root, in every module, with more than limit lines, sorted
// by path. Generated files (zz_generated.*), bin/ (downloaded tools) and .git are skipped.
func longFiles(root string, limit int) ([]longFile, error) {
	var out []longFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "bin" || d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasPrefix(d.Name(), "zz_generated.") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := bytes.Count(data, []byte("\n")); n > limit {
			out = append(out, longFile{rel, n})
		}
		return nil
	})
	return out, err
}

// repoRoot is the directory of the root module's go.mod, two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.Contains(data, []byte("module github.com/redline-dev/redline\n")) {
		t.Fatalf("%s is not the repository's root (go.mod: %v)", root, err)
	}
	return root
}
