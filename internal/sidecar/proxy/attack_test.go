package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// Attacks on the proxy face from the application's side: the application is trusted to answer
// its own requests, never to answer someone else's. Bytes it sends beyond its own framing
// (a bug an attacker can often provoke with crafted input) must not become the response to
// another client's request on another TCP connection.

// injected is a complete HTTP/1.1 response an attacker wants served to a victim.
const injected = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 25\r\n\r\n<script>alert(1)</script>"

// leakyApp is an application, hand-written on purpose, that answers some paths with bytes
// beyond their framing in the same write, and every other path correctly with "for <path>".
// It keeps each connection alive.
func leakyApp(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					var answer string
					switch req.URL.Path {
					case "/short-length": // Content-Length counts less than what follows
						answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + injected
					case "/head-body": // a body on a HEAD response, which has none by definition
						answer = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(injected), injected)
					case "/no-content-body": // a body on a 204, which has none by definition
						answer = "HTTP/1.1 204 No Content\r\n\r\n" + injected
					default:
						body := "for " + req.URL.Path
						answer = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					}
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestApplicationBytesBeyondFramingNeverReachAnotherClient(t *testing.T) {
	front, _ := startProxy(t, leakyApp(t), nil)
	for _, tc := range []struct{ name, method, path string }{
		{"short Content-Length", http.MethodGet, "/short-length"},
		{"body on HEAD", http.MethodHead, "/head-body"},
		{"body on 204", http.MethodGet, "/no-content-body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			// Separate clients: the attacker's and the victim's requests reach the sidecar on
			// different TCP connections.
			attacker := &http.Client{Transport: &http.Transport{}}
			victim := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(attacker.CloseIdleConnections)
			t.Cleanup(victim.CloseIdleConnections)
			for i := range 20 {
				req, _ := http.NewRequest(tc.method, front.URL+tc.path, nil)
				req.Header.Set("X-Key", "attacker")
				if resp, err := attacker.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}

				path := fmt.Sprintf("/victim-%d", i)
				req, _ = http.NewRequest(http.MethodGet, front.URL+path, nil)
				req.Header.Set("X-Key", "victim")
				resp, body := do(t, victim, req)
				g.Expect(body).NotTo(ContainSubstring("<script>"), "round %d: the attacker's bytes reached the victim", i)
				g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "round %d", i)
				g.Expect(body).To(Equal("for "+path), "round %d: the victim gets its own response", i)
			}
		})
	}
}

// A response the client asked for with HEAD never carries a body to the client either.
func TestHeadResponseBodyNotForwarded(t *testing.T) {
	g := NewWithT(t)
	front, _ := startProxy(t, leakyApp(t), nil)
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	_, err = io.WriteString(conn, "HEAD /head-body HTTP/1.1\r\nHost: app\r\nX-Key: k\r\n\r\nGET /next HTTP/1.1\r\nHost: app\r\nX-Key: k\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	br := bufio.NewReader(conn)
	head, err := http.ReadResponse(br, &http.Request{Method: http.MethodHead})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(head.StatusCode).To(Equal(http.StatusOK))
	next, err := http.ReadResponse(br, nil)
	g.Expect(err).NotTo(HaveOccurred(), "the next bytes on the connection are the next response, not the HEAD's body")
	body, _ := io.ReadAll(next.Body)
	g.Expect(strings.TrimSpace(string(body))).To(Equal("for /next"))
}
