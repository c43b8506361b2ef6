package layout

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/redline-dev/redline/"

// upward are imports that would run back up the layout's one direction (docs/development.md):
// a package of the key's folder importing one under a value. The controllers and the injector
// share what they both need through internal/backend, never one through the other; the engine
// and its building blocks know nothing of the control plane or the sidecar's faces.
var upward = map[string][]string{
	"internal/controller":       {"internal/webhook", "cmd"},
	"internal/webhook":          {"internal/controller", "cmd"},
	"internal/backend":          {"internal/controller", "internal/webhook", "cmd"},
	"internal/limiter":          {"internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/keyscheme":        {"internal/limiter", "internal/fleet", "internal/redisacl", "internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/fleet":            {"internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/redisconn":        {"internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/policydoc":        {"internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/redisacl":         {"internal/controller", "internal/webhook", "internal/backend", "internal/sidecar", "cmd"},
	"internal/sidecar/contract": {"internal/controller", "internal/webhook", "internal/backend", "cmd"},
}

// controlLoops are internal/controller's packages of one control loop each: a loop shares what
// it needs with another through internal/controller/loop (and the compiler), never imports
// another, and the shared packages import no loop.
var controlLoops = []string{"budget", "memorypolicy", "policies", "redisbackend", "scriptwatcher", "tenantacl", "topkeysstatus"}

func init() {
	shared := []string{"internal/controller/loop", "internal/controller/compile"}
	for _, l := range controlLoops {
		from := "internal/controller/" + l
		for _, o := range controlLoops {
			if o != l {
				upward[from] = append(upward[from], "internal/controller/"+o)
			}
		}
		for _, s := range shared {
			upward[s] = append(upward[s], from)
		}
	}
	upward["internal/controller/compile"] = append(upward["internal/controller/compile"], "internal/controller/loop")
}

// TestNoImportRunsBackUp holds the product's imports (tests aside) to the layout's direction.
func TestNoImportRunsBackUp(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	for from, banned := range upward {
		err := filepath.WalkDir(filepath.Join(root, from), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, b := range banned {
					if local, ok := strings.CutPrefix(p, module); ok && (local == b || strings.HasPrefix(local, b+"/")) {
						t.Errorf("%s imports %s: %s must not depend on %s", filepath.ToSlash(rel), p, from, b)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
