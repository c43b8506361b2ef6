package limiter

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

func TestNewClientDefaultsFitTheHotPath(t *testing.T) {
	g := NewWithT(t)
	c, err := NewClient("redis://127.0.0.1:1/3", ClientOptions{Password: "from-secret"})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	rc, ok := c.(*redis.Client)
	g.Expect(ok).To(BeTrue(), "one host makes a plain client, got %T", c)
	o := rc.Options()
	g.Expect(o.DB).To(Equal(3))
	g.Expect(o.Password).To(Equal("from-secret"))
	g.Expect(o.PoolSize).To(Equal(16))
	g.Expect(o.MaxActiveConns).To(Equal(32))
	g.Expect(o.ReadTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.WriteTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.PoolTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.MaxRetries).To(BeZero(), "a decision is not retried: it could count twice")

	c2, err := NewClient("redis://127.0.0.1:1,127.0.0.1:2", ClientOptions{PoolSize: 4, ReadTimeout: 20 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	defer c2.Close()
	cc, ok := c2.(*redis.ClusterClient)
	g.Expect(ok).To(BeTrue(), "a seed list makes a cluster client, got %T", c2)
	g.Expect(cc.Options().PoolSize).To(Equal(4))
	g.Expect(cc.Options().ReadTimeout).To(Equal(20 * time.Millisecond))

	_, err = NewClient("memcached://x", ClientOptions{})
	g.Expect(err).To(MatchError(ErrInvalidURL))
}

func TestRedactURL(t *testing.T) {
	g := NewWithT(t)
	g.Expect(RedactURL("redis://user:hunter2@h:6379/0")).To(Equal("redis://***@h:6379/0"))
	g.Expect(RedactURL("rediss://:p@ss@h")).To(Equal("rediss://***@h"))
	g.Expect(RedactURL("redis://h:6379")).To(Equal("redis://h:6379"))
}
