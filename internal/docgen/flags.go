package docgen

import (
	"bytes"
	"flag"
	"fmt"
	"strings"

	"github.com/redline-dev/redline/internal/manager"
	"github.com/redline-dev/redline/internal/sidecar/app"
)

// FlagSets are the manager's and the sidecar's flags, as their binaries define them, with the
// environment each flag may take its default from. The defaults shown are those of an empty
// environment.
func FlagSets() []NamedFlagSet {
	none := func(string) string { return "" }
	mfs := flag.NewFlagSet("manager", flag.ContinueOnError)
	manager.BindFlags(mfs, none)
	return []NamedFlagSet{
		{Title: "Manager", Binary: "manager", Set: mfs, Env: manager.FlagEnv},
		{Title: "Sidecar", Binary: "sidecar", Set: app.FlagSet(none), Env: app.FlagEnv},
	}
}

// NamedFlagSet is one binary's flags.
type NamedFlagSet struct {
	Title, Binary string
	Set           *flag.FlagSet
	Env           map[string]string
}

func genFlags(_ string, b *bytes.Buffer) error {
	b.WriteString("\n# Flags\n\n")
	b.WriteString("The manager's and the sidecar's command-line flags, as `-help` prints them. The chart sets the\n")
	b.WriteString("manager's from its values and the injector sets the sidecar's (the manager's `--sidecar-*` flags\n")
	b.WriteString("give their cluster-wide defaults, a pod's annotations override them). A default in the\n")
	b.WriteString("Environment column's variable replaces the one shown.\n")
	for _, s := range FlagSets() {
		fmt.Fprintf(b, "\n## %s\n\n", s.Title)
		table(b, "Flag", "Type", "Default", "Environment", "Description")
		s.Set.VisitAll(func(f *flag.Flag) {
			typ, usage := flag.UnquoteUsage(f)
			if typ == "" {
				typ = "bool"
			}
			row(b, code("--"+f.Name), typ, code(f.DefValue), code(s.Env[f.Name]), cell(usage))
		})
	}
	return nil
}

// FlagNames are the names of a set's flags, in its order.
func FlagNames(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f.Name) })
	return out
}

// HelpFlags are the flag names a -help output lists (its "  -name" lines).
func HelpFlags(help string) []string {
	var out []string
	for l := range strings.SplitSeq(help, "\n") {
		if rest, ok := strings.CutPrefix(l, "  -"); ok {
			out = append(out, strings.Fields(rest)[0])
		}
	}
	return out
}
