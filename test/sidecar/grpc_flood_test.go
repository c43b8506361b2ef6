package sidecar_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// A client opening many h2c connections to the proxy face, each with several server streams
// held open, gets no more streams in flight than the face's bound (--max-conns, sized from the
// container's memory limit: 315 at 64Mi), the rest UNAVAILABLE; the sidecar stays under its
// memory limit with every admitted stream open through it to the application.
func TestH2CStreamFloodStaysWithinTheBounds(t *testing.T) {
	const (
		conns      = 200
		perConn    = 5
		wantStream = 315 // proxyConnsFor(64Mi, 64 KiB), as the proxy's connection bound
	)
	g := NewWithT(t)
	e := newEnv(t, "orders")
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "orders", policydoc.Rule{
		Name: "watches", Match: &policydoc.Match{ExactPath: watchMethod}, Key: []policydoc.KeyPart{{Header: "x-tenant"}},
		Algorithm: "FixedWindow", Requests: 1_000_000, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}))
	app := newGRPCApp(t, nil)
	s := startWithEnv(t, "h2-flood", e, app.addr, []string{fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", memoryLimit)}, "--upstream-protocol=H2C")
	g.Expect(s.Log()).To(ContainSubstring(fmt.Sprintf(`"maxConns":%d`, wantStream)))
	pid := s.Pid()
	before := rssMiB(t, pid)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var admitted, unavailable atomic.Int64
	settled := make(chan error, conns*perConn)
	for range conns {
		conn, err := grpc.NewClient(hostPort(s.proxy), grpc.WithTransportCredentials(insecure.NewCredentials()))
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = conn.Close() })
		c := healthpb.NewHealthClient(conn)
		for range perConn {
			go func() {
				w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{Service: "orders"})
				if err == nil {
					_, err = w.Recv()
				}
				switch {
				case err == nil:
					admitted.Add(1)
				case status.Code(err) == codes.Unavailable:
					unavailable.Add(1)
				}
				settled <- err
			}()
		}
	}
	for range conns * perConn {
		if err := <-settled; err != nil && status.Code(err) != codes.Unavailable {
			t.Errorf("a stream ended other than admitted or UNAVAILABLE: %v", err)
		}
	}
	peak := rssMiB(t, pid)
	t.Logf("%d connections x %d streams: %d admitted and held, %d UNAVAILABLE; RSS %.1f MiB before, %.1f MiB holding them (limit %d MiB)",
		conns, perConn, admitted.Load(), unavailable.Load(), before, peak, memoryLimit>>20)
	g.Expect(admitted.Load()).To(BeEquivalentTo(wantStream))
	g.Expect(unavailable.Load()).To(BeEquivalentTo(conns*perConn - wantStream))
	g.Expect(app.served[watchMethod].Load()).To(BeEquivalentTo(wantStream), "refused streams never reach the application")
	g.Expect(peak).To(BeNumerically("<", memoryLimit>>20))
}
