package docs_test

// The rule for the commands of docs/getting-started.md, which a new user runs one after
// another and must all work:
//
// Every line of a fenced block tagged sh is a command (a line ending in "\" continues on the
// next; blank lines and "#" comments are skipped). A command passes when
//
//  1. it is make with one or more targets (and VAR=value assignments), and `make -n <target>`
//     succeeds in the repository root for each target, so the target exists; or
//  2. it matches an entry of ranByTests. Each entry names the test that runs the command, or
//     performs its step against the same real parts (a kube-apiserver, Helm's install
//     action, a redis-server, the sidecar binary), by a file and a string that file must
//     contain; the entry fails when either is gone. Every path of the repository a command
//     names (config/..., charts/..., .ci/...) must exist.
//
// Any other command fails the test: add a test that runs it (and an entry here), make it a
// make target, or take it off the page. An entry no command uses fails too, so the list
// stays the page's.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// ranBy is a test that runs a command of the page, or its step.
type ranBy struct {
	command  *regexp.Regexp
	file     string // relative to the root
	contains string // the test, as its file names it
	how      string
}

var ranByTests = []ranBy{
	{
		command: regexp.MustCompile(`^kubectl create namespace redline-system$`),
		file:    "test/helm/install_test.go", contains: "install.CreateNamespace",
		how: "the chart's install test creates the release namespace in a real kube-apiserver",
	},
	{
		command: regexp.MustCompile(`^kubectl -n redline-system create secret generic redline-redis --from-file=password=\./redis-password$`),
		file:    "internal/testutil/failover/manager.go", contains: "--redis-password-file=",
		how: "test/failover runs the manager binary with Redis's admin password in a file, as the chart mounts this Secret",
	},
	{
		command: regexp.MustCompile(`^helm install redline charts/redline -n redline-system( --set [a-zA-Z.]+=\S+)+$`),
		file:    "test/helm/install_test.go", contains: "func TestInstallUpgradeUninstall(",
		how: "Helm's install action installs charts/redline into a real kube-apiserver and runs the manager it renders",
	},
	{
		command: regexp.MustCompile(`^kubectl create namespace shop$`),
		file:    "internal/controller/samples_test.go", contains: `It("pair the sample workload with the sample policy"`,
		how: "the controller suite creates a namespace for the samples",
	},
	{
		command: regexp.MustCompile(`^kubectl apply -n shop -f config/samples/workload/$`),
		file:    "internal/controller/samples_test.go", contains: `sampleDocuments(filepath.Join("workload", "*.yaml"))`,
		how: "the controller suite creates every object of config/samples/workload and injects a pod of its template",
	},
	{
		command: regexp.MustCompile(`^kubectl apply -n shop -f config/samples/shadow/checkout_per_api_key\.yaml$`),
		file:    "internal/controller/samples_test.go", contains: `"shadow", "checkout_per_api_key.yaml"`,
		how: "the controller suite creates the Shadow sample, then replaces it with the enforcing one",
	},
	{
		command: regexp.MustCompile(`^kubectl redline status -n shop checkout-per-api-key$`),
		file:    "test/e2e/topkeys_test.go", contains: `runKubectlRedline(g, ctx, "status", "-n", namespace, p.Name)`,
		how: "the end-to-end suite runs the built plugin's status against real sidecars' reports",
	},
	{
		command: regexp.MustCompile(`^kubectl apply -n shop -f config/samples/checkout_per_api_key\.yaml$`),
		file:    "internal/controller/samples_test.go", contains: `"checkout_per_api_key.yaml"`,
		how: "the controller suite creates the sample policy and waits for Programmed",
	},
	{
		command: regexp.MustCompile(`^kubectl -n shop get rlp$`),
		file:    "internal/controller/samples_test.go", contains: "ConditionEnforced",
		how: "the controller suite reads the conditions the printer columns show",
	},
	{
		command: regexp.MustCompile(`^curl -i -X POST -H 'X-API-Key: k1' http://checkout\.shop\.svc/api/orders$`),
		file:    "test/sidecar/exact_test.go", contains: "func TestThreeReplicasShareOneLimit(",
		how: "POSTs with an X-API-Key through the sidecar binary's proxy until the 429 and its headers",
	},
}

// repoPath finds the arguments of a command that name a path of the repository.
var repoPath = regexp.MustCompile(`(?:^|\s)((?:config|charts|\.ci|hack|docs|results)/\S*)`)

// makeCommand is make with targets and assignments.
var makeCommand = regexp.MustCompile(`^make(\s+\S+)+$`)

// commands lists the commands of a page's sh blocks.
func commands(p page) []link {
	var out []link
	for _, block := range p.codeBlocks("sh") {
		var cur *link
		for _, l := range block {
			s := strings.TrimSpace(l.dest)
			if cur == nil {
				if s == "" || strings.HasPrefix(s, "#") {
					continue
				}
				cur = &link{line: l.line}
			}
			if cont, ok := strings.CutSuffix(s, `\`); ok {
				cur.dest += strings.TrimSpace(cont) + " "
				continue
			}
			cur.dest += s
			out = append(out, *cur)
			cur = nil
		}
		if cur != nil {
			out = append(out, *cur)
		}
	}
	return out
}

// checkCommand says why a command breaks the rule, or "" when it keeps it; used collects
// the entries it matched.
func checkCommand(cmd string, used map[int]bool, makeN func(target string) error) string {
	for _, m := range repoPath.FindAllStringSubmatch(cmd, -1) {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[1]))); err != nil {
			return "it names " + m[1] + ", which does not exist"
		}
	}
	if makeCommand.MatchString(cmd) {
		targets := 0
		for _, f := range strings.Fields(cmd)[1:] {
			if strings.Contains(f, "=") {
				continue
			}
			if strings.HasPrefix(f, "-") {
				return "make with option " + f + ": show the targets alone"
			}
			targets++
			if err := makeN(f); err != nil {
				return "make -n " + f + " fails: " + err.Error()
			}
		}
		if targets == 0 {
			return "make without a target"
		}
		return ""
	}
	for i, r := range ranByTests {
		if !r.command.MatchString(cmd) {
			continue
		}
		used[i] = true
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(r.file)))
		if err != nil {
			return "its test file " + r.file + " cannot be read: " + err.Error()
		}
		if !strings.Contains(string(data), r.contains) {
			return r.file + " no longer contains " + r.contains + ", the test that ran it"
		}
		return ""
	}
	return "no test runs it and it is no make target: add a test and an entry to ranByTests, or take it off the page"
}

func makeDryRun(target string) error {
	cmd := exec.Command("make", "-n", target)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// TestDocsGettingStartedCommandsAreRun holds docs/getting-started.md to the rule above.
func TestDocsGettingStartedCommandsAreRun(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not on PATH (apt-get install make): %v", err)
	}
	const file = "docs/getting-started.md"
	cmds := commands(readPage(t, file))
	if len(cmds) == 0 {
		t.Fatalf("%s shows no sh commands", file)
	}
	used := map[int]bool{}
	for _, c := range cmds {
		if why := checkCommand(c.dest, used, makeDryRun); why != "" {
			t.Errorf("%s:%d: %q: %s", file, c.line, c.dest, why)
		}
	}
	for i, r := range ranByTests {
		if !used[i] {
			t.Errorf("ranByTests entry %s (%s) matches no command of %s: delete it", r.command, r.how, file)
		}
	}
}

// TestDocsCommandRuleRefusesWhatItMust: the rule, on commands written here.
func TestDocsCommandRuleRefusesWhatItMust(t *testing.T) {
	makeN := makeDryRun
	for cmd, ok := range map[string]bool{
		"make demo":                        true,
		"make demo DEMO_FLAGS=-pause":      true,
		"make no-such-target-anywhere":     false,
		"make":                             false,
		"make -C elsewhere demo":           false,
		"kubectl -n shop get rlp":          true,
		"kubectl -n shop delete rlp --all": false,
		"kubectl apply -n shop -f config/samples/no-such.yaml": false,
		"curl http://example.com/":                             false,
	} {
		why := checkCommand(cmd, map[int]bool{}, makeN)
		if (why == "") != ok {
			t.Errorf("%q: %q, want ok=%v", cmd, why, ok)
		}
	}
}

func TestDocsCommandsJoinContinuations(t *testing.T) {
	p := parse([]byte("```sh\n# a comment\nhelm install a \\\n  --set b=c\n\nmake demo\n```\n\n```text\nnot a command\n```\n"))
	got := commands(p)
	if len(got) != 2 || got[0].dest != "helm install a --set b=c" || got[1].dest != "make demo" || got[0].line != 3 {
		t.Errorf("commands = %+v", got)
	}
}
