package sidecar_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Path rules match as Gateway API's HTTPPathMatch does, through the built sidecar: a prefix by
// whole path elements (before, /login also counted /login-help and /loginx), Exact one path.
func TestPathRulesMatchByElementAndExactly(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	rule := func(name string, m *policydoc.Match) policydoc.Rule {
		return policydoc.Rule{Name: name, Match: m, Key: []policydoc.KeyPart{{Header: "x-key"}},
			Algorithm: "FixedWindow", Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}
	}
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "web",
		rule("login", &policydoc.Match{PathPrefix: "/login/"}), rule("health", &policydoc.Match{ExactPath: "/health"})))
	s := start(t, "pathmatch", e, shared.URL(), up.addr(), true)
	send := func(target string) int {
		c, err := net.Dial("tcp", hostPort(s.proxy))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = c.Close() }()
		_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nConnection: close\r\n\r\n", target)
		g.Expect(err).NotTo(HaveOccurred())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		g.Expect(err).NotTo(HaveOccurred(), target)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Each rule admits 1: the first request it counts passes, the next it counts is refused.
	for _, step := range []struct {
		target string
		want   int
	}{
		{"/login", http.StatusOK}, // the prefix's trailing slash is ignored
		{"/login/reset", http.StatusTooManyRequests},
		{"/login-help", http.StatusOK},
		{"/loginx", http.StatusOK},
		{"/LOGIN/reset", http.StatusOK}, // case-sensitive, as Gateway API
		{"/x/../login", http.StatusTooManyRequests},
		{"/login%2F..", http.StatusBadRequest},
		{"/login;jsessionid=1", http.StatusBadRequest}, // a path parameter: refused, as Tomcat strips it
		{"/health/", http.StatusOK},                    // not Exact /health
		{"/health/x", http.StatusOK},
		{"/health", http.StatusOK},
		{"/./health", http.StatusTooManyRequests},
		{"/healthz", http.StatusOK},
	} {
		g.Expect(send(step.target)).To(Equal(step.want), step.target)
	}
}
