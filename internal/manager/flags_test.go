package manager_test

import (
	"flag"
	"io"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/manager"
)

// The environment gives the defaults it always gave; flags win over it.
func TestBindFlagsDefaultsFromTheEnvironment(t *testing.T) {
	g := NewWithT(t)
	env := map[string]string{"REDLINE_REDIS_URL": "redis://from-env:6379", "POD_NAMESPACE": "ops"}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := manager.BindFlags(fs, func(k string) string { return env[k] })
	g.Expect(fs.Parse(nil)).To(Succeed())
	g.Expect(o.RedisURL).To(Equal("redis://from-env:6379"))
	g.Expect(o.Webhook.Namespace).To(Equal("ops"))
	g.Expect(o.TenantACL).To(Equal("auto"))
	g.Expect(o.CredentialRotation).To(Equal(24 * time.Hour))
	for name, env := range manager.FlagEnv {
		g.Expect(fs.Lookup(name)).NotTo(BeNil(), "FlagEnv names flag --%s (env %s)", name, env)
	}

	fs = flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o = manager.BindFlags(fs, func(string) string { return "" })
	g.Expect(fs.Parse([]string{"--redis-url=redis://flag:1", "--leader-elect", "--sidecar-image=s:1", "--zap-log-level=debug", "--kubeconfig=/k"})).To(Succeed())
	g.Expect(o.RedisURL).To(Equal("redis://flag:1"))
	g.Expect(o.LeaderElect).To(BeTrue())
	g.Expect(o.Webhook.SidecarImage).To(Equal("s:1"))
	g.Expect(o.Webhook.Namespace).To(Equal("redline-system"))
}
