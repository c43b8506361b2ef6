// Command hostile measures what hostile or careless clients get from the built sidecar, on a
// redis-server of its own and a fake model upstream that counts the tokens it bills:
//
//   - the image case: chat requests of N image_url parts and max_tokens 1 against a
//     FixedWindow budget of 10,000 tokens a minute per X-API-Key, from 12 clients to a fast
//     model and from 64 clients to a model that takes 2 s; the upstream bills each image 765
//     tokens (a 1024 px image of gpt-4o's pricing) and counts what it served. Every case runs
//     inside one minute's window, on a key of its own, and reports the tokens served on that
//     key in that window;
//   - the memory flood: 300 connections each send a token budget request of a 1 MiB body and
//     withhold its last byte, to a sidecar whose container memory limit is the injector's
//     64 MiB (REDLINE_MEMORY_LIMIT, from which it sets GOMEMLIMIT as in a pod): the sidecar's
//     peak RSS (VmHWM), the answers by status, and whether another key is still decided.
//
// Usage (from hack/bench): go run ./cmd/hostile [-out ../../results] [-sidecar BIN]
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

func main() {
	out := flag.String("out", "", "directory to write hostile.md into (empty: stdout only)")
	root := flag.String("root", "../..", "the product module's directory, where ./cmd/sidecar is built")
	bin := flag.String("sidecar", "", "a sidecar binary to use instead of building ./cmd/sidecar")
	run := flag.Duration("run", 40*time.Second, "how long each image case sends, inside one window")
	flag.Parse()
	if err := measure(*out, *root, *bin, *run); err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func measure(out, root, bin string, run time.Duration) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hostile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin == "" {
		if bin, err = sidecarproc.Build(ctx, root, dir); err != nil {
			return err
		}
	}
	srv, err := redistest.Start()
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()

	images, err := imageCases(ctx, dir, bin, srv.URL(), run)
	if err != nil {
		return err
	}
	flood, err := memoryFlood(ctx, dir, bin, srv.URL())
	if err != nil {
		return err
	}
	report := render(images, flood, run)
	fmt.Print(report)
	if out != "" {
		return os.WriteFile(filepath.Join(out, "hostile.md"), []byte(report), 0o644)
	}
	return nil
}

// budgetDoc is the policies document: a FixedWindow token budget of 10,000 a minute per
// X-API-Key on /v1/chat/completions (defaultHold 1,000, minOutput 1), and 3 calls a minute
// per X-Key on /plain.
func budgetDoc() ([]byte, error) {
	tokens := policydoc.Rule{
		Name: "tokens", Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: "FixedWindow",
		Requests: 10_000, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
		Match: &policydoc.Match{PathPrefix: "/v1/chat/completions"},
		Cost: &policydoc.Cost{From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "redline-cost",
			DefaultHold: 1_000, MinOutput: 1, OnError: policydoc.OnErrorUsed, TimeoutMS: time.Minute.Milliseconds()},
	}
	plain := policydoc.Rule{
		Name: "calls", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow",
		Requests: 3, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce", Match: &policydoc.Match{PathPrefix: "/plain"},
	}
	_, data, err := policydoc.Build("bench", []policydoc.Policy{{
		Name: "llm", Generation: 1, FailureMode: "Closed",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
		Rules:    []policydoc.Rule{tokens, plain},
	}}, map[string]string{})
	return data, err
}

// startSidecar runs the built sidecar named name in front of upstream, with more environment.
func startSidecar(ctx context.Context, dir, bin, name, redisURL, upstream string, env ...string) (*sidecarproc.Sidecar, error) {
	doc, err := budgetDoc()
	if err != nil {
		return nil, err
	}
	files, err := sidecarproc.WriteFiles(filepath.Join(dir, name), doc, "web")
	if err != nil {
		return nil, err
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
		defer os.Unsetenv(k) //nolint:errcheck // the child has its copy
	}
	return sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: dir, Name: name, Namespace: "bench", Files: files,
		RedisURL: redisURL, Upstream: upstream})
}

// upstreamOf serves m on a loopback port until stop is called.
func upstreamOf(m http.Handler) (addr string, stop func(), err error) {
	srv := &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
	ln, err := listenLoopback()
	if err != nil {
		return "", nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// fakeModel is a fake OpenAI upstream that bills each request input tokens and takes delay for
// its one output token.
func fakeModel(input int64, delay time.Duration) *fakemodel.Server {
	return fakemodel.New(fakemodel.Config{Input: input, TokenDelay: delay})
}
