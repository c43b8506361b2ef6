package docgen

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Const is one string constant of a package, with its doc comment.
type Const struct {
	Name, Value string
	// Doc is the constant's own comment, or its const block's where it has none.
	Doc string
}

// StringConsts reads the string constants whose names start with one of prefixes from the Go
// files (tests left out) of the package in dir, sorted by name.
func StringConsts(dir string, prefixes ...string) ([]Const, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	// Every string constant's value, so that one defined as another resolves.
	values := map[string]ast.Expr{}
	type found struct {
		name string
		doc  string
	}
	var want []found
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						values[n.Name] = vs.Values[i]
					}
					if !hasPrefix(n.Name, prefixes) || !n.IsExported() {
						continue
					}
					doc := vs.Doc.Text()
					if doc == "" {
						doc = vs.Comment.Text()
					}
					if doc == "" {
						doc = g.Doc.Text()
					}
					want = append(want, found{n.Name, doc})
				}
			}
		}
	}
	var out []Const
	for _, w := range want {
		v, err := resolve(values, w.name, 0)
		if err != nil {
			continue // not a string constant (a number, a duration)
		}
		out = append(out, Const{Name: w.name, Value: v, Doc: strings.Join(strings.Fields(w.doc), " ")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func resolve(values map[string]ast.Expr, name string, depth int) (string, error) {
	e, ok := values[name]
	if !ok || depth > 8 {
		return "", fmt.Errorf("%s: no value", name)
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("%s: not a string", name)
		}
		return strconv.Unquote(e.Value)
	case *ast.Ident:
		return resolve(values, e.Name, depth+1)
	}
	return "", fmt.Errorf("%s: not a literal", name)
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// ContractDir is the package whose constants name the pod annotations.
const ContractDir = "internal/sidecar/contract"

// Annotations are the pod annotations (and the pod label) the injector reads or writes.
func Annotations(root string) ([]Const, error) {
	return StringConsts(filepath.Join(root, ContractDir), "Annotation", "Label")
}

func genAnnotations(root string, b *bytes.Buffer) error {
	cs, err := Annotations(root)
	if err != nil {
		return err
	}
	b.WriteString("\n# Annotations\n\n")
	b.WriteString("The pod annotations the injector reads when it injects a sidecar (set them on a Deployment's pod\n")
	b.WriteString("template), the label that opts a pod in like the annotation does, and the annotation the injector\n")
	b.WriteString("writes. A namespace opts in its pods with a label, below.\n\n")
	table(b, "Name", "Constant", "Meaning")
	for _, c := range cs {
		row(b, code(c.Value), code(c.Name), cell(c.Doc))
	}
	label, value, doc, err := NamespaceInjection(root)
	if err != nil {
		return err
	}
	b.WriteString("\n## Namespace label\n\n")
	table(b, "Label", "Constant", "Meaning")
	row(b, code(label+": "+value), code("NamespaceLabelInjection"), cell(doc))
	return nil
}

// NamespaceInjection is the namespace label that opts a namespace's pods in, the value that
// does, and the label's doc comment, read from the contract package.
func NamespaceInjection(root string) (label, value, doc string, err error) {
	cs, err := StringConsts(filepath.Join(root, ContractDir), "NamespaceLabelInjection", "NamespaceInjectionEnabled")
	if err != nil {
		return "", "", "", err
	}
	for _, c := range cs {
		switch c.Name {
		case "NamespaceLabelInjection":
			label, doc = c.Value, c.Doc
		case "NamespaceInjectionEnabled":
			value = c.Value
		}
	}
	if label == "" || value == "" {
		return "", "", "", fmt.Errorf("%s: no NamespaceLabelInjection or NamespaceInjectionEnabled", ContractDir)
	}
	return label, value, doc, nil
}

// APIDir is the package holding the condition types and their reasons.
const APIDir = "api/v1alpha1"

// Conditions are the condition types of the API's objects.
func Conditions(root string) ([]Const, error) {
	return StringConsts(filepath.Join(root, APIDir), "Condition")
}

// Reasons are the reasons the controllers write on conditions, declared beside the types.
func Reasons(root string) ([]Const, error) {
	return StringConsts(filepath.Join(root, APIDir), "Reason")
}

func genConditions(root string, b *bytes.Buffer) error {
	conds, err := Conditions(root)
	if err != nil {
		return err
	}
	reasons, err := Reasons(root)
	if err != nil {
		return err
	}
	b.WriteString("\n# Conditions and reasons\n\n")
	b.WriteString("The conditions Redline writes in `.status.conditions` of a RateLimitPolicy and a RedisBackend,\n")
	b.WriteString("and the reasons they carry. `kubectl describe` shows each condition's reason and message; the\n")
	b.WriteString("manager also exports Accepted, Programmed and Enforced as `redline_policy_condition`.\n\n")
	b.WriteString("## Condition types\n\n")
	table(b, "Type", "Constant", "Meaning")
	for _, c := range conds {
		row(b, code(c.Value), code(c.Name), cell(c.Doc))
	}
	b.WriteString("\n## Reasons\n\n")
	b.WriteString("Several constants may carry one reason (RedisUnavailable is each condition's when Redis does not\n")
	b.WriteString("answer); each is listed with what it says.\n\n")
	sort.SliceStable(reasons, func(i, j int) bool { return reasons[i].Value < reasons[j].Value })
	table(b, "Reason", "Constant", "Meaning")
	for _, c := range reasons {
		row(b, code(c.Value), code(c.Name), cell(c.Doc))
	}
	return nil
}
