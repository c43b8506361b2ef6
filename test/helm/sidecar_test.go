package helm

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
)

// sidecarFlags are the manager's cluster-wide sidecar defaults the chart may pass.
var sidecarFlags = []string{"--sidecar-failure-mode", "--sidecar-cpu-request", "--sidecar-memory-request", "--sidecar-memory-limit",
	"--sidecar-max-procs", "--sidecar-redis-pool-size", "--sidecar-lease-keys", "--sidecar-lease-horizon", "--sidecar-redis-timeout",
	"--sidecar-trusted-hops"}

// managerArgs renders the chart with vals and returns the manager container's flags.
func managerArgs(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	g := NewWithT(t)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	out, err := Render(ch, vals)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := Objects(out)
	g.Expect(err).NotTo(HaveOccurred())
	dep := convert[appsv1.Deployment](g, Find(objs, "Deployment", "redline-manager"))
	return flagMap(dep.Spec.Template.Spec.Containers[0].Args)
}

// TestSidecarDefaultsReachManagerArgs: each sidecar.* default becomes the manager's flag, and
// an unset one passes nothing (the manager's own default holds).
func TestSidecarDefaultsReachManagerArgs(t *testing.T) {
	t.Run("unset: no flag", func(t *testing.T) {
		g := NewWithT(t)
		args := managerArgs(t, map[string]any{})
		for _, f := range sidecarFlags {
			g.Expect(args).NotTo(HaveKey(f))
		}
	})
	t.Run("set: every flag", func(t *testing.T) {
		g := NewWithT(t)
		args := managerArgs(t, map[string]any{"sidecar": map[string]any{
			"failureMode": "LocalFallback",
			"resources": map[string]any{
				"requests": map[string]any{"cpu": "100m", "memory": "96Mi"},
				"limits":   map[string]any{"memory": "1Gi"},
			},
			"maxProcs": 2, "redisPoolSize": 8, "leaseKeys": 1048576, "leaseHorizon": "500ms", "redisTimeout": "100ms",
			"trustedHops": 2,
		}})
		g.Expect(args).To(HaveKeyWithValue("--sidecar-failure-mode", "LocalFallback"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-cpu-request", "100m"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-memory-request", "96Mi"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-memory-limit", "1Gi"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-max-procs", "2"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-redis-pool-size", "8"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-lease-keys", "1048576"), "a large integer stays an integer")
		g.Expect(args).To(HaveKeyWithValue("--sidecar-lease-horizon", "500ms"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-redis-timeout", "100ms"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-trusted-hops", "2"))
	})
	t.Run("trusted hops as YAML writes them; 0 is the manager's default", func(t *testing.T) {
		g := NewWithT(t)
		vals, err := ParseValues([]byte("sidecar:\n  trustedHops: 16\n"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(managerArgs(t, vals)).To(HaveKeyWithValue("--sidecar-trusted-hops", "16"))
		vals, err = ParseValues([]byte("sidecar:\n  trustedHops: 0\n"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(managerArgs(t, vals)).NotTo(HaveKey("--sidecar-trusted-hops"), "0 is the manager's own default: the peer address")
	})
	t.Run("leases off and numbers as YAML writes them", func(t *testing.T) {
		g := NewWithT(t)
		vals, err := ParseValues([]byte("sidecar:\n  leaseHorizon: 0\n  resources:\n    requests: {cpu: 1}\n"))
		g.Expect(err).NotTo(HaveOccurred())
		args := managerArgs(t, vals)
		g.Expect(args).To(HaveKeyWithValue("--sidecar-lease-horizon", "0"), "0 turns leases off: it is passed, not taken for unset")
		g.Expect(args).To(HaveKeyWithValue("--sidecar-cpu-request", "1"))
		g.Expect(args).NotTo(HaveKey("--sidecar-memory-request"))
	})
}

// TestSchemaRefusesBadSidecarDefaults: a typo or a wrong type in sidecar.* fails helm install
// naming the field, before a manager could refuse it.
func TestSchemaRefusesBadSidecarDefaults(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, values, want string
	}{
		{"failure mode in the wrong case", "failureMode: closed", "at '/sidecar/failureMode': value must be one of '', 'Open', 'Closed', 'LocalFallback'"},
		{"a CPU limit, which the injector does not set", "resources: {limits: {cpu: 1}}", "at '/sidecar/resources/limits': additional properties 'cpu' not allowed"},
		{"a typo under resources", "resources: {request: {cpu: 1}}", "at '/sidecar/resources': additional properties 'request' not allowed"},
		{"not a quantity", "resources: {requests: {memory: 64MB}}", "at '/sidecar/resources/requests/memory'"},
		{"a negative quantity", "resources: {requests: {cpu: -1}}", "at '/sidecar/resources/requests/cpu'"},
		{"too many procs", "maxProcs: 65", "at '/sidecar/maxProcs': maximum: got 65, want 64"},
		{"procs as a string", `maxProcs: "2"`, "at '/sidecar/maxProcs': got string, want integer"},
		{"a pool of 1", "redisPoolSize: 1", "at '/sidecar/redisPoolSize': minimum: got 1, want 2"},
		{"a pool beyond 1024", "redisPoolSize: 2048", "at '/sidecar/redisPoolSize': maximum: got 2,048, want 1,024"},
		{"too many lease keys", "leaseKeys: 2000000", "at '/sidecar/leaseKeys': maximum"},
		{"a horizon that is no duration", "leaseHorizon: 2 seconds", "at '/sidecar/leaseHorizon'"},
		{"a horizon as a number other than 0", "leaseHorizon: 2", "at '/sidecar/leaseHorizon': maximum: got 2, want 0"},
		{"a timeout as a number", "redisTimeout: 50", "at '/sidecar/redisTimeout': got number, want string"},
		{"a timeout without a unit", `redisTimeout: "50"`, "at '/sidecar/redisTimeout'"},
		{"trusted hops beyond 16", "trustedHops: 17", "at '/sidecar/trustedHops': maximum: got 17, want 16"},
		{"negative trusted hops", "trustedHops: -1", "at '/sidecar/trustedHops': minimum: got -1, want 0"},
		{"trusted hops as a string", `trustedHops: "1"`, "at '/sidecar/trustedHops': got string, want integer"},
		{"fractional trusted hops", "trustedHops: 1.5", "at '/sidecar/trustedHops': got number, want integer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			vals, err := ParseValues([]byte("sidecar:\n  " + strings.ReplaceAll(tt.values, "\n", "\n  ") + "\n"))
			g.Expect(err).NotTo(HaveOccurred())
			_, err = Render(ch, vals)
			g.Expect(err).To(MatchError(ContainSubstring("values don't meet the specifications of the schema")))
			g.Expect(err).To(MatchError(ContainSubstring(tt.want)))
		})
	}
}
