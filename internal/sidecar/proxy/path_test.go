package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// refuseAll refuses every request a rule matches.
type refuseAll struct{}

func (refuseAll) Allow(_ context.Context, _ string, l limiter.Limit, _ int64) (limiter.Result, error) {
	return limiter.Result{OverLimit: true, RetryAfter: time.Second, ResetAfter: l.Window, Source: limiter.SourceRedis}, nil
}

// A rule on /admin/ covers every spelling of a path under /admin/ that the application routes
// there, and the application is sent the path that was matched: a request is never matched as
// one path and routed as another.
func TestPathIsMatchedAndForwardedNormalised(t *testing.T) {
	g := NewWithT(t)
	var (
		mu   sync.Mutex
		seen []string
	)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.EscapedPath()+" "+r.URL.Path)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	doc := sidecartest.DocumentPathPrefix("ns", "p", "r", "web", 10, time.Minute, "x-key", "/admin/")
	front, _ := startProxy(t, up.Listener.Addr().String(), func(o *proxy.Options) {
		o.Engine = &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: refuseAll{}.Allow}}
		o.Store = sidecartest.StoreOf(t, doc)
	})
	addr := front.Listener.Addr().String()
	for _, tc := range []struct {
		target    string
		status    int
		forwarded string // escaped and decoded path the application saw
	}{
		{"/admin/users", http.StatusTooManyRequests, ""},
		{"/./admin/users", http.StatusTooManyRequests, ""},
		{"//admin/users", http.StatusTooManyRequests, ""},
		{"/admin//users", http.StatusTooManyRequests, ""},
		{"/public/../admin/users", http.StatusTooManyRequests, ""},
		{"/public/%2e%2e/admin/users", http.StatusTooManyRequests, ""},
		{"/%61dmin/users", http.StatusTooManyRequests, ""},
		{"/admin", http.StatusTooManyRequests, ""}, // the prefix's trailing slash is ignored
		{"/administrator", http.StatusOK, "/administrator /administrator"},
		{"/admin-help/x", http.StatusOK, "/admin-help/x /admin-help/x"},
		{"/public/./x//y/", http.StatusOK, "/public/x/y/ /public/x/y/"},
		{"/a%20b/%7euser?q=1", http.StatusOK, "/a%20b/~user /a b/~user"},
		{"/admin%2Fusers", http.StatusBadRequest, ""},
		{"/admin%5cusers", http.StatusBadRequest, ""},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		c, err := net.Dial("tcp", addr)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: shop\r\nX-Key: k\r\nConnection: close\r\n\r\n", tc.target)
		g.Expect(err).NotTo(HaveOccurred())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		g.Expect(err).NotTo(HaveOccurred(), tc.target)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.Close()
		g.Expect(resp.StatusCode).To(Equal(tc.status), tc.target)
		mu.Lock()
		got := seen
		mu.Unlock()
		if tc.forwarded == "" {
			g.Expect(got).To(BeEmpty(), "%s reached the application", tc.target)
		} else {
			g.Expect(got).To(Equal([]string{tc.forwarded}), tc.target)
		}
	}
}
