package tenantacl

import (
	"testing"

	. "github.com/onsi/gomega"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Unprotected sentinels make a namespace's isolation false, with a reason naming Sentinel and
// a message saying what a tenant can then do and what the admin should change; protected
// ones leave the verdict to the rest of the reconcile.
func TestSentinelIsolation(t *testing.T) {
	g := NewWithT(t)
	ok, reason, msg := sentinelIsolation("")
	g.Expect(ok).To(BeTrue())
	g.Expect(reason).To(BeEmpty())
	g.Expect(msg).To(BeEmpty())

	ok, reason, msg = sentinelIsolation("a sentinel's default user needs no password")
	g.Expect(ok).To(BeFalse())
	g.Expect(reason).To(Equal(v1alpha1.ReasonSentinelUnprotected))
	g.Expect(msg).To(ContainSubstring("a sentinel's default user needs no password"))
	g.Expect(msg).To(ContainSubstring("SENTINEL REMOVE and MONITOR"))
	g.Expect(msg).To(ContainSubstring("SENTINEL FAILOVER"))
	g.Expect(msg).To(ContainSubstring("--redis-sentinel-password-file"))
	g.Expect(loop.Message(msg)).To(Equal(msg), "the whole message fits the condition")
}

// The Secret carries the sentinel reader only with Sentinel, and the cached digest tells a
// Secret without it from one with it, so adding the reader rewrites the Secret.
func TestSecretDataCarriesTheSentinelReader(t *testing.T) {
	g := NewWithT(t)
	without := desiredSecretData("shop", "pw", "")
	g.Expect(without).NotTo(HaveKey(contract.RedisSentinelSecretKey))
	with := desiredSecretData("shop", "pw", "sentinel-pw")
	g.Expect(with).To(HaveKeyWithValue(contract.RedisSentinelUsernameKey, []byte(redisacl.SentinelReaderUser)))
	g.Expect(with).To(HaveKeyWithValue(contract.RedisSentinelSecretKey, []byte("sentinel-pw")))
	g.Expect(dataDigest(with)).NotTo(Equal(dataDigest(without)))
	g.Expect(deriveSentinelPassword([]byte("k1"))).NotTo(Equal(deriveSentinelPassword([]byte("k2"))))
	g.Expect(deriveSentinelPassword([]byte("k1"))).NotTo(Equal(derivePassword([]byte("k1"), "shop", 0)))
}
