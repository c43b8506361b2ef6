package sidecar_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The sidecar's faces run on maintained protocol stacks: the rate limit service on grpc-go
// with go-control-plane's generated types, the proxy on net/http's httputil.ReverseProxy.
// Hand-written HTTP/1, HTTP/2, gRPC framing or protobuf codecs must not come back: no sidecar
// package may import the low-level pieces they were built from.
func TestFacesUseStandardStacks(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}",
		"github.com/redline-dev/redline/internal/sidecar/...", "github.com/redline-dev/redline/cmd/sidecar").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	if len(imports) < 5 {
		t.Fatalf("go list found %d sidecar packages: is this the sidecar?", len(imports))
	}
	banned := []string{
		"golang.org/x/net/http2",                        // HTTP/2 framing: grpc-go and net/http own it
		"golang.org/x/net/http2/hpack",                  // header compression, likewise
		"golang.org/x/net/http2/h2c",                    // a second HTTP/2 server
		"google.golang.org/protobuf/encoding/protowire", // a hand-made protobuf codec
	}
	for pkg, imps := range imports {
		for _, b := range banned {
			if slices.Contains(imps, b) {
				t.Errorf("%s imports %s: use grpc-go / net/http instead of owning the protocol", pkg, b)
			}
		}
	}
	// The faces read and write no bytes of a connection themselves (bufio is how
	// hand-written HTTP/1 began).
	for _, face := range []string{"proxy", "rls", "checkapi"} {
		pkg := "github.com/redline-dev/redline/internal/sidecar/" + face
		if slices.Contains(imports[pkg], "bufio") {
			t.Errorf("%s imports bufio: leave connection I/O to net/http and grpc-go", pkg)
		}
	}
	want := map[string][]string{
		"github.com/redline-dev/redline/internal/sidecar/rls": {
			"google.golang.org/grpc", "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3",
			"google.golang.org/grpc/health",
		},
		"github.com/redline-dev/redline/internal/sidecar/proxy": {"net/http/httputil"},
	}
	for pkg, need := range want {
		for _, n := range need {
			if !slices.Contains(imports[pkg], n) {
				t.Errorf("%s does not import %s", pkg, n)
			}
		}
	}
}
