package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// goListDeps returns the packages pkg imports, directly or not, itself included.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// The sidecar serves Envoy's rate limit service without grpc-go and go-control-plane: linking
// them (and running their init) cost 6 MiB of idle RSS. The tests use both as the client.
func TestBinaryLinksNoGRPC(t *testing.T) {
	deps := goListDeps(t, ".")
	const rlsPkg = "github.com/redline-dev/redline/internal/sidecar/rls"
	found := false
	for _, d := range deps {
		found = found || d == rlsPkg
		for _, banned := range []string{"google.golang.org/grpc", "github.com/envoyproxy/go-control-plane", "github.com/cncf/xds"} {
			if d == banned || strings.HasPrefix(d, banned+"/") {
				t.Errorf("the sidecar links %s", d)
			}
		}
	}
	if !found {
		t.Fatalf("%s is not among the sidecar's packages (%d listed): is this the sidecar?", rlsPkg, len(deps))
	}

	// The rate limit service itself uses only protobuf's wire format, no reflection runtime
	// (the sidecar still links that one for Prometheus' client).
	allowed := map[string]bool{
		"google.golang.org/protobuf/encoding/protowire": true,
		"google.golang.org/protobuf/internal/detrand":   true,
		"google.golang.org/protobuf/internal/errors":    true,
	}
	for _, d := range goListDeps(t, rlsPkg) {
		if strings.HasPrefix(d, "google.golang.org/protobuf/") && !allowed[d] {
			t.Errorf("%s links %s", rlsPkg, d)
		}
	}
}
