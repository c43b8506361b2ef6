package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// An HTTP/1.1 offer to switch to h2c never reaches the application: accepted, it would turn
// the connection into a tunnel whose HTTP/2 streams nothing decides. The request is served as
// HTTP/1.1.
func TestH2CUpgradeIsNotPassedOn(t *testing.T) {
	g := NewWithT(t)
	seen := make(chan http.Header, 1)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, "plain")
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nConnection: Upgrade, HTTP2-Settings\r\n"+
		"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(string(body)).To(Equal("plain"))
	h := <-seen
	g.Expect(h).NotTo(HaveKey("Upgrade"))
	g.Expect(h).NotTo(HaveKey("Http2-Settings"))
}
