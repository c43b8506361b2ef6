// Command testtimes reads `go test -json` on stdin, writes each test's output to stdout as it
// arrives (what `go test` without -json prints), and, at the end, the packages by the time
// their tests took, slowest first, to stdout and to the file -out (markdown). It exits 1 when
// any package or test failed, as go test does, so that
//
//	go test -json ./... | go run ./hack/testtimes -out test-times.md
//
// fails the build under pipefail exactly when the tests fail.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// pkg is one package's outcome.
type pkg struct {
	name    string
	action  string // pass, fail or skip
	elapsed time.Duration
}

func main() {
	out := flag.String("out", "", "also write the packages' times as a markdown table to this file")
	flag.Parse()
	pkgs, failed, err := report(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(2)
	}
	table := render(pkgs)
	fmt.Print("\n" + table)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// report copies the tests' output to w and collects the packages' outcomes. A line that is not
// an event (a build error go test prints as is) is copied too and counts as a failure.
func report(r io.Reader, w io.Writer) ([]pkg, bool, error) {
	var pkgs []pkg
	failed := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			if _, err := fmt.Fprintf(w, "%s\n", line); err != nil {
				return nil, false, err
			}
			failed = failed || strings.Contains(string(line), "FAIL")
			continue
		}
		if e.Output != "" {
			if _, err := io.WriteString(w, e.Output); err != nil {
				return nil, false, err
			}
		}
		switch {
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			pkgs = append(pkgs, pkg{name: e.Package, action: e.Action, elapsed: time.Duration(e.Elapsed * float64(time.Second))})
			failed = failed || e.Action == "fail"
		case e.Action == "fail":
			failed = true
		}
	}
	return pkgs, failed, sc.Err()
}

// render is the packages with tests, slowest first, as a markdown table with their total.
func render(pkgs []pkg) string {
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].elapsed > pkgs[j].elapsed })
	var b strings.Builder
	var total time.Duration
	b.WriteString("| package | result | seconds |\n| --- | --- | ---: |\n")
	for _, p := range pkgs {
		if p.action == "skip" {
			continue // no test files
		}
		total += p.elapsed
		fmt.Fprintf(&b, "| `%s` | %s | %.1f |\n", strings.TrimPrefix(p.name, "github.com/redline-dev/redline/"), p.action, p.elapsed.Seconds())
	}
	fmt.Fprintf(&b, "| all | | %.1f |\n", total.Seconds())
	return b.String()
}
