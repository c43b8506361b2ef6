package redisconn

import (
	"crypto/tls"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

func TestNewClientDefaultsFitTheHotPath(t *testing.T) {
	g := NewWithT(t)
	c, err := NewClient("redis://127.0.0.1:1/3", Options{Password: "from-secret"})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	rc, ok := c.(*redis.Client)
	g.Expect(ok).To(BeTrue(), "one host makes a plain client, got %T", c)
	o := rc.Options()
	g.Expect(o.DB).To(Equal(3))
	g.Expect(o.Password).To(Equal("from-secret"))
	g.Expect(o.PoolSize).To(Equal(16))
	g.Expect(o.MaxActiveConns).To(Equal(16), "a pod never opens more than its pool")
	g.Expect(o.MinIdleConns).To(BeZero(), "connections open on the first call that needs one")
	g.Expect(o.MaxIdleConns).To(Equal(16), "a connection returned under load is kept, not redialed")
	g.Expect(o.ReadBufferSize).To(Equal(8 << 10))
	g.Expect(o.WriteBufferSize).To(Equal(8 << 10))
	g.Expect(o.ConnMaxIdleTime).To(Equal(time.Minute))
	g.Expect(o.ReadTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.WriteTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.PoolTimeout).To(Equal(50 * time.Millisecond))
	g.Expect(o.MaxRetries).To(BeZero(), "a decision is not retried: it could count twice")

	c2, err := NewClient("redis://127.0.0.1:1,127.0.0.1:2", Options{PoolSize: 4, ReadTimeout: 20 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	defer c2.Close()
	cc, ok := c2.(*redis.ClusterClient)
	g.Expect(ok).To(BeTrue(), "a seed list makes a cluster client, got %T", c2)
	g.Expect(cc.Options().PoolSize).To(Equal(4))
	g.Expect(cc.Options().ReadTimeout).To(Equal(20 * time.Millisecond))

	_, err = NewClient("memcached://x", Options{})
	g.Expect(err).To(MatchError(ErrInvalidURL))
}

func TestRedactURL(t *testing.T) {
	g := NewWithT(t)
	g.Expect(RedactURL("redis://user:hunter2@h:6379/0")).To(Equal("redis://***@h:6379/0"))
	g.Expect(RedactURL("rediss://:p@ss@h")).To(Equal("rediss://***@h"))
	g.Expect(RedactURL("redis://h:6379")).To(Equal("redis://h:6379"))
}

func TestParseURL(t *testing.T) {
	// No server name: each connection verifies the host it dials (TLSOptions.ServerName).
	tls12 := func(string) *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS12} }
	cases := []struct {
		url  string
		want redis.UniversalOptions
		err  bool
	}{
		{url: "redis://localhost", want: redis.UniversalOptions{Addrs: []string{"localhost:6379"}}},
		{url: "rediss://u:p%40ss@redis.example:6380/2", want: redis.UniversalOptions{Addrs: []string{"redis.example:6380"}, DB: 2, Username: "u", Password: "p@ss", TLSConfig: tls12("redis.example")}},
		{url: "redis://a:1,b:2,c:3", want: redis.UniversalOptions{Addrs: []string{"a:1", "b:2", "c:3"}, IsClusterMode: true}},
		{url: "redis://a:1?cluster=true&client_name=x", want: redis.UniversalOptions{Addrs: []string{"a:1"}, IsClusterMode: true, ClientName: "x"}},
		{url: "redis+sentinel://:pw@s1,s2:26380/mymaster/1", want: redis.UniversalOptions{Addrs: []string{"s1:26379", "s2:26380"}, Password: "pw", SentinelPassword: "pw", MasterName: "mymaster", DB: 1}},
		{url: "rediss+sentinel://s1?master_name=m", want: redis.UniversalOptions{Addrs: []string{"s1:26379"}, MasterName: "m", TLSConfig: tls12("s1")}},
		{url: "redis://[::1]:7000", want: redis.UniversalOptions{Addrs: []string{"[::1]:7000"}}},
		{url: "localhost:6379", err: true},
		{url: "http://x", err: true},
		{url: "redis://a:1,,b:2", err: true},
		{url: "redis://a:99999", err: true},
		{url: "redis://a/x", err: true},
		{url: "redis://a/-1", err: true},
		{url: "redis://a/1/2", err: true},
		{url: "redis://a?pool=3", err: true},
		{url: "redis://a?pool_size=3", err: true},
		{url: "redis+sentinel://s1", err: true},
		{url: "redis://a:1,b:2/3", err: true},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			g := NewWithT(t)
			got, err := parseURL(c.url)
			if c.err {
				g.Expect(err).To(MatchError(ErrInvalidURL))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(*got).To(Equal(c.want))
		})
	}
	for _, u := range []string{"redis://user:hunter2@host:bad", "redis://user:hunter2%zz@host"} {
		_, err := parseURL(u)
		NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("invalid redis url"), Not(ContainSubstring("hunter2")))), u)
	}
}
