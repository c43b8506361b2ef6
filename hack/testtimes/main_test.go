package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReportCopiesOutputAndTimesPackages(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"github.com/redline-dev/redline/internal/a"}`,
		`{"Action":"output","Package":"github.com/redline-dev/redline/internal/a","Test":"TestX","Output":"=== RUN   TestX\n"}`,
		`{"Action":"pass","Package":"github.com/redline-dev/redline/internal/a","Test":"TestX","Elapsed":0.5}`,
		`{"Action":"output","Package":"github.com/redline-dev/redline/internal/a","Output":"ok  \tgithub.com/redline-dev/redline/internal/a\t1.5s\n"}`,
		`{"Action":"pass","Package":"github.com/redline-dev/redline/internal/a","Elapsed":1.5}`,
		`{"Action":"pass","Package":"github.com/redline-dev/redline/internal/b","Elapsed":12.25}`,
		`{"Action":"skip","Package":"github.com/redline-dev/redline/internal/c","Elapsed":0}`,
	}, "\n")
	var out bytes.Buffer
	pkgs, failed, err := report(strings.NewReader(in), &out)
	if err != nil || failed {
		t.Fatalf("report: %v, failed %v", err, failed)
	}
	if got := out.String(); got != "=== RUN   TestX\nok  \tgithub.com/redline-dev/redline/internal/a\t1.5s\n" {
		t.Errorf("output copied: %q", got)
	}
	want := "| package | result | seconds |\n| --- | --- | ---: |\n| `internal/b` | pass | 12.2 |\n| `internal/a` | pass | 1.5 |\n| all | | 13.8 |\n"
	if got := render(pkgs); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestReportFailsWhatGoTestFails(t *testing.T) {
	for name, in := range map[string]string{
		"a failed package": `{"Action":"fail","Package":"p","Elapsed":1}`,
		"a failed test":    `{"Action":"fail","Package":"p","Test":"TestY","Elapsed":1}`,
		"a build error":    "# p\nFAIL\tp [build failed]",
	} {
		_, failed, err := report(strings.NewReader(in), &bytes.Buffer{})
		if err != nil || !failed {
			t.Errorf("%s: failed %v, err %v", name, failed, err)
		}
	}
}
