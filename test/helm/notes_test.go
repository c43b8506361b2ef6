package helm

import (
	"testing"

	. "github.com/onsi/gomega"
)

// What helm install prints tells the installer what to do next: check the manager, opt a
// Deployment in, apply a first policy, find the docs; with Sentinel and TLS, what they need.
func TestNotesSayWhatToDoNext(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("default values", func(t *testing.T) {
		g := NewWithT(t)
		_, notes, err := RenderWithNotes(ch, map[string]any{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(notes).To(ContainSubstring("kubectl -n redline-system rollout status deployment/redline-manager"))
		g.Expect(notes).To(ContainSubstring("webhook.certificates=selfSigned"), "the manager makes the webhook's certificate by default")
		g.Expect(notes).NotTo(ContainSubstring("get certificate"))
		g.Expect(notes).To(ContainSubstring(`"redline.dev/inject":"true","redline.dev/upstream-port":"8080"`))
		g.Expect(notes).To(ContainSubstring("kind: RateLimitPolicy"))
		g.Expect(notes).To(ContainSubstring("kubectl -n <namespace> get rlp"))
		g.Expect(notes).To(ContainSubstring("redis://redis.redline-system.svc:6379"))
		g.Expect(notes).To(ContainSubstring("/tree/main/docs"))
		g.Expect(notes).To(ContainSubstring("charts/redline/README.md#values"))
		g.Expect(notes).NotTo(ContainSubstring("Sentinel"))
		g.Expect(notes).NotTo(ContainSubstring("TLS"))
	})
	t.Run("Redis over TLS through Sentinel", func(t *testing.T) {
		g := NewWithT(t)
		_, notes, err := RenderWithNotes(ch, readValues(t, "everything"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(notes).To(ContainSubstring("through Sentinel"))
		g.Expect(notes).To(ContainSubstring("Secret redline-redis-sentinel"))
		g.Expect(notes).To(ContainSubstring("over TLS, verified with the CA in Secret redline-redis-tls"))
		g.Expect(notes).To(ContainSubstring("Every namespace with injected pods needs Secret redline-redis-tls (ca.crt, tls.crt, tls.key)"))
	})
	t.Run("Sentinel without a password, cert-manager certificates", func(t *testing.T) {
		g := NewWithT(t)
		_, notes, err := RenderWithNotes(ch, map[string]any{
			"redis":   map[string]any{"url": "redis+sentinel://s1:26379,s2:26379/mymaster"},
			"webhook": map[string]any{"certificates": "certManager"},
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(notes).To(ContainSubstring("TenantIsolation=False (SentinelUnprotected)"))
		g.Expect(notes).To(ContainSubstring("kubectl -n redline-system get certificate"))
		g.Expect(notes).NotTo(ContainSubstring("webhook.certificates=selfSigned"))
	})
}
