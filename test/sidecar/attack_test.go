package sidecar_test

import (
	"bytes"
	binenc "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// These tests attack the decision faces of a running sidecar as a client on the pod network
// (or in the pod) would. Each one reproduces an attack that worked on the hand-written HTTP/2
// and gRPC server this sidecar had before grpc-go.

// rssMiB reads the resident set of a process from /proc.
func rssMiB(t testing.TB, pid int) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the sidecar's /proc status: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				t.Fatalf("parsing VmRSS %q: %v", rest, err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS in /proc status")
	return 0
}

func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// rlsClient dials the sidecar's rate limit service with grpc-go.
func rlsClient(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func rlsDescriptor(key string, addend *wrapperspb.UInt64Value) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries:    []*rlv3.RateLimitDescriptor_Entry{{Key: "policy", Value: "p"}, {Key: "rule", Value: "r"}, {Key: "k", Value: key}},
		HitsAddend: addend,
	}}}
}

// h2Flooder opens a cleartext HTTP/2 connection and starts gRPC calls that send only the
// 5-byte message prefix, claiming a large message, and then nothing.
type h2Flooder struct {
	conn   net.Conn
	framer *http2.Framer
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
}

func dialFlooder(addr string) (*h2Flooder, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	f := &h2Flooder{conn: c, framer: http2.NewFramer(c, c)}
	f.enc = hpack.NewEncoder(&f.hbuf)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		c.Close()
		return nil, err
	}
	if err := f.framer.WriteSettings(); err != nil {
		c.Close()
		return nil, err
	}
	// Read (and drop) whatever the server sends, so that its writes never block on us.
	go func() { _, _ = io.Copy(io.Discard, c) }()
	return f, nil
}

func (f *h2Flooder) openStream(id uint32, claimed uint32) error {
	f.hbuf.Reset()
	for _, hf := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "sidecar"},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := f.enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]}); err != nil {
			return err
		}
	}
	if err := f.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: f.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	prefix := []byte{0, 0, 0, 0, 0}
	binenc.BigEndian.PutUint32(prefix[1:], claimed)
	return f.framer.WriteData(id, false, prefix)
}

// Streams that send only a length prefix claiming a large message cost the sidecar no memory
// for the message: the old server allocated the claimed size per stream (1 GiB of RSS from
// about 250 KB sent). The flood uses more connections than the sidecar accepts, each with as
// many streams as it allows, while a legitimate client keeps getting answers.
func TestRLSLengthPrefixFloodKeepsMemoryBounded(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1_000_000, time.Minute, "x-key", "Open", "FixedWindow"))
	s := start(t, "flood", e, shared.URL(), "127.0.0.1:1", true)
	legit := rlsClient(t, s.grpc)
	resp, err := legit.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor("legit", nil))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	before := rssMiB(t, s.Pid())

	const conns, streams = 48, 64 // over the 32 connections the sidecar accepts, each with all 64 streams it allows
	var (
		mu       sync.Mutex
		flooders []*h2Flooder
		wg       sync.WaitGroup
	)
	t.Cleanup(func() {
		for _, f := range flooders {
			f.conn.Close()
		}
	})
	for range conns {
		wg.Go(func() {
			f, err := dialFlooder(s.grpc)
			if err != nil {
				return // refused or not accepted: the cap works
			}
			mu.Lock()
			flooders = append(flooders, f)
			mu.Unlock()
			_ = f.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			for i := range streams {
				if f.openStream(uint32(2*i+1), 16<<20) != nil { // 16 MiB claimed per stream
					return
				}
				if f.openStream(uint32(2*(i+streams)+1), 60<<10) != nil { // just under the message limit
					return
				}
			}
		})
	}
	wg.Wait()
	g.Expect(flooders).NotTo(BeEmpty())

	// The legitimate client, on its own connection, is still answered.
	for i := range 20 {
		resp, err := legit.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor(fmt.Sprint("legit-", i), nil))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	}
	after := 0.0 // the peak over a second, while every flooding stream is still open
	for range 10 {
		after = max(after, rssMiB(t, s.Pid()))
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("RSS %.1f MiB before the flood, %.1f MiB peak with %d flooding connections of %d streams each (claiming 16 MiB and 60 KiB)",
		before, after, len(flooders), 2*streams)
	g.Expect(after).To(BeNumerically("<", 64), "the injected container's memory limit is 64 MiB")
}

// grpc-go closes a connection without calls after --idle-timeout (MaxConnectionIdle), with a
// GOAWAY; the old server kept idle connections forever.
func TestRLSIdleConnectionIsClosed(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Open"))
	s := start(t, "idle", e, shared.URL(), "127.0.0.1:1", true, "--idle-timeout=1s")
	c, err := net.DialTimeout("tcp", s.grpc, 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	_, err = io.WriteString(c, http2.ClientPreface)
	g.Expect(err).NotTo(HaveOccurred())
	fr := http2.NewFramer(c, c)
	g.Expect(fr.WriteSettings()).To(Succeed())
	g.Expect(c.SetReadDeadline(time.Now().Add(15 * time.Second))).To(Succeed())
	var goAway bool
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ne net.Error
			g.Expect(errors.As(err, &ne) && ne.Timeout()).To(BeFalse(), "the idle connection was still open after 15s")
			break // closed by the sidecar
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goAway = true
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		}
	}
	g.Expect(goAway).To(BeTrue(), "the sidecar says GOAWAY before closing")
}

// hits_addend is unsigned: 2^63 and more used to wrap to a negative int64 and count as 1.
// Any cost beyond the rule's limit is refused as never admissible, and counts nothing.
func TestRLSHugeHitsAddendIsRefused(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Open", "FixedWindow"))
	s := start(t, "addend", e, shared.URL(), "127.0.0.1:1", true)
	client := rlsClient(t, s.grpc)
	for _, v := range []uint64{11, math.MaxInt64, 1 << 63, 1<<63 + 1, math.MaxUint64} {
		resp, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor("victim", wrapperspb.UInt64(v)))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT), "hits_addend %d", v)
		for _, h := range resp.ResponseHeadersToAdd {
			g.Expect(h.Key).NotTo(Equal("Retry-After"), "hits_addend %d can never be admitted", v)
		}
	}
	// Nothing was counted: the whole limit is still there.
	resp, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor("victim", wrapperspb.UInt64(10)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Expect(resp.Statuses[0].LimitRemaining).To(BeZero())
}

// /v1/check refuses bodies beyond its bounds with a 400 that says why, before any decision.
func TestCheckAPIBounds(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Open", "FixedWindow"))
	s := start(t, "bounds", e, shared.URL(), "127.0.0.1:1", true)
	hit := `{"policy":"p","rule":"r","key":["victim"]}`
	for _, c := range []struct {
		name, body, want string
	}{
		{"1,574 hits in 65 KB", `{"hits":[` + strings.Repeat(hit+",", 1573) + hit + `]}`, "over 65536 bytes"},
		{"33 hits", `{"hits":[` + strings.Repeat(hit+",", 32) + hit + `]}`, "33 hits: at most 32"},
		{"trailing data", hit + `{"policy":"p","rule":"r"}`, "data after the JSON object"},
		{"unknown field", `{"policy":"p","rule":"r","costs":5}`, `unknown field \"costs\"`},
		{"negative cost", `{"policy":"p","rule":"r","cost":-5}`, "cost -5"},
		{"cost beyond int64", `{"policy":"p","rule":"r","cost":18446744073709551615}`, "decoding check request"},
	} {
		resp, err := httpClient.Post(s.check+checkapi.Path, "application/json", strings.NewReader(c.body))
		g.Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), c.name)
		g.Expect(string(body)).To(ContainSubstring(c.want), c.name)
	}
	// A cost above the limit is a refusal that never clears, and spends nothing.
	var d checkapi.Response
	resp, err := httpClient.Post(s.check+checkapi.Path, "application/json", strings.NewReader(`{"policy":"p","rule":"r","key":["victim"],"cost":11}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(decodeJSON(resp, &d)).To(Succeed())
	g.Expect(d.Allowed).To(BeFalse())
	g.Expect(d.RetryAfterSeconds).To(Equal(int64(-1)))
	resp, err = httpClient.Post(s.check+checkapi.Path, "application/json", strings.NewReader(`{"policy":"p","rule":"r","key":["victim"],"cost":10}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(decodeJSON(resp, &d)).To(Succeed())
	g.Expect(d.Allowed).To(BeTrue(), "the limit is whole: nothing above was counted")
	g.Expect(s.metric(t, `redline_sidecar_redis_decisions_total`)).To(BeNumerically("<=", 1),
		"only the admitted check reached Redis")
}

// The decision faces listen on loopback by default: a client on another address of the
// machine (as the pod network is to a pod) cannot reach them, while a sidecar that opts in
// (binding every interface) serves it. Health and metrics stay reachable.
func TestDecisionFacesStayInsideThePod(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Open"))
	// start binds the faces to 127.0.0.1, as the injector does unless the pod opts in. The
	// admin port binds every interface, as injected.
	_, adminPort, _ := net.SplitHostPort(freePort(t))
	inPod := start(t, "in-pod", e, shared.URL(), "127.0.0.1:1", true, "--admin-listen=:"+adminPort)
	outside := func(hostPort string) string {
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(hostPort, "http://"))
		return "127.0.0.2:" + port // another address of this machine: not loopback's 127.0.0.1
	}
	for name, addr := range map[string]string{"/v1/check": outside(inPod.check), "gRPC": outside(inPod.grpc)} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		g.Expect(err).To(HaveOccurred(), "%s of a pod that did not opt in is reachable at %s", name, addr)
	}
	resp, err := http.Get("http://127.0.0.2:" + adminPort + "/healthz")
	g.Expect(err).NotTo(HaveOccurred(), "health stays reachable off loopback")
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))

	_, checkPort, _ := net.SplitHostPort(freePort(t))
	_, grpcPort, _ := net.SplitHostPort(freePort(t))
	exposed := start(t, "exposed", e, shared.URL(), "127.0.0.1:1", true, "--check-listen=:"+checkPort, "--grpc-listen=:"+grpcPort)
	resp, err = httpClient.Post("http://127.0.0.2:"+checkPort+checkapi.Path, "application/json", strings.NewReader(`{"policy":"p","rule":"r","key":["k"]}`))
	g.Expect(err).NotTo(HaveOccurred(), "an exposed pod serves /v1/check on the pod network")
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	out, err := rlsClient(t, "127.0.0.2:"+grpcPort).ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor("k", nil))
	g.Expect(err).NotTo(HaveOccurred(), "an exposed pod serves the rate limit service on the pod network")
	g.Expect(out.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	_ = exposed
}
