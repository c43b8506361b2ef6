// Package docs_test holds the project's documentation to its rules: every relative link and
// anchor resolves (links_test.go), no page is longer than a reader will read (length_test.go),
// and every command docs/getting-started.md shows is run by a test or is a make target
// (commands_test.go). Markdown is read with goldmark, a maintained CommonMark parser with
// GitHub's table extension, so a link is what GitHub renders as a link.
package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// root is the repository root, from test/docs.
var root = filepath.Join("..", "..")

// checkedFiles are the Markdown files whose links are checked, relative to the root: the
// README, the CHANGELOG, every page of docs/ and the reports of results/.
func checkedFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing docs/: %v", err)
	}
	results, err := filepath.Glob(filepath.Join(root, "results", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		rel, _ := filepath.Rel(root, r)
		files = append(files, filepath.ToSlash(rel))
	}
	sort.Strings(files)
	return files
}

// page is a parsed Markdown file.
type page struct {
	src []byte
	doc ast.Node
}

var markdown = goldmark.New(goldmark.WithExtensions(extension.GFM))

func parse(src []byte) page {
	return page{src: src, doc: markdown.Parser().Parse(text.NewReader(src))}
}

func readPage(t *testing.T, rel string) page {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return parse(src)
}

// link is a link or image destination and the line it is on.
type link struct {
	dest string
	line int
}

// links lists the page's link and image destinations.
func (p page) links() []link {
	var out []link
	_ = ast.Walk(p.doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		var dest []byte
		switch n := n.(type) {
		case *ast.Link:
			dest = n.Destination
		case *ast.Image:
			dest = n.Destination
		default:
			return ast.WalkContinue, nil
		}
		out = append(out, link{dest: string(dest), line: p.lineOf(n)})
		return ast.WalkContinue, nil
	})
	return out
}

// lineOf is the 1-based line of an inline node: that of its first text, or of the block
// holding it.
func (p page) lineOf(n ast.Node) int {
	at := -1
	_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
		if t, ok := c.(*ast.Text); ok && entering {
			at = t.Segment.Start
			return ast.WalkStop, nil
		}
		return ast.WalkContinue, nil
	})
	for c := n.Parent(); at < 0 && c != nil; c = c.Parent() {
		if c.Type() == ast.TypeBlock && c.Lines().Len() > 0 {
			at = c.Lines().At(0).Start
		}
	}
	if at < 0 {
		return 0
	}
	return bytes.Count(p.src[:at], []byte("\n")) + 1
}

// anchors are the page's heading anchors as GitHub makes them.
func (p page) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	_ = ast.Walk(p.doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if h, ok := n.(*ast.Heading); ok && entering {
			s := slug(plainText(h, p.src))
			if k := seen[s]; k > 0 {
				out[s+"-"+strconv.Itoa(k)] = true
			} else {
				out[s] = true
			}
			seen[s]++
			return ast.WalkSkipChildren, nil
		}
		return ast.WalkContinue, nil
	})
	return out
}

// plainText is a node's text as a reader sees it: code spans without their backticks, links
// as their text, emphasis without its marks.
func plainText(n ast.Node, src []byte) string {
	var b strings.Builder
	_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch c := c.(type) {
		case *ast.Text:
			b.Write(c.Segment.Value(src))
			if c.SoftLineBreak() || c.HardLineBreak() {
				b.WriteByte(' ')
			}
		case *ast.String:
			b.Write(c.Value)
		}
		return ast.WalkContinue, nil
	})
	return b.String()
}

// slug is GitHub's heading anchor: lower case; letters, digits, '-' and '_' kept, spaces
// turned into '-', everything else dropped ("`match.pathPrefix` is deprecated" is
// "matchpathprefix-is-deprecated").
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// codeBlocks lists the fenced code blocks of the page whose info string is lang, as lines,
// each with its line number in the file.
func (p page) codeBlocks(lang string) [][]link {
	var out [][]link
	_ = ast.Walk(p.doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		fc, ok := n.(*ast.FencedCodeBlock)
		if !ok || !entering || string(fc.Language(p.src)) != lang {
			return ast.WalkContinue, nil
		}
		var block []link
		for i := 0; i < fc.Lines().Len(); i++ {
			seg := fc.Lines().At(i)
			block = append(block, link{
				dest: strings.TrimRight(string(seg.Value(p.src)), "\n"),
				line: bytes.Count(p.src[:seg.Start], []byte("\n")) + 1,
			})
		}
		out = append(out, block)
		return ast.WalkContinue, nil
	})
	return out
}

// TestDocsSlugIsGitHubs pins slug to anchors GitHub gives headings of this repository.
func TestDocsSlugIsGitHubs(t *testing.T) {
	for heading, want := range map[string]string{
		"Defaults, and why":                        "defaults-and-why",
		"`match.pathPrefix` is deprecated":         "matchpathprefix-is-deprecated",
		"Against envoyproxy/ratelimit":             "against-envoyproxyratelimit",
		"The decision API: `POST /v1/check`":       "the-decision-api-post-v1check",
		"A Redis of its own: RedisBackend":         "a-redis-of-its-own-redisbackend",
		"Step 1: Redis":                            "step-1-redis",
		"1. The local demo":                        "1-the-local-demo",
		"Manager and sidecars: which version runs": "manager-and-sidecars-which-version-runs",
	} {
		p := parse([]byte("# " + heading + "\n"))
		if got := p.anchors(); !got[want] {
			t.Errorf("heading %q: anchors %v, want %q", heading, got, want)
		}
	}
	// A repeated heading gets -1, -2, ... as on GitHub.
	if got := parse([]byte("# Runbooks\n\n# Runbooks\n")).anchors(); !got["runbooks"] || !got["runbooks-1"] {
		t.Errorf("repeated heading: anchors %v, want runbooks and runbooks-1", got)
	}
}
