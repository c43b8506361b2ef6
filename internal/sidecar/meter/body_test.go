package meter

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// bodyResult is what a handler saw: ReadBody's answer, then what the upstream would read.
type bodyResult struct {
	read      []byte
	err       error
	forwarded []byte
	fwdErr    error
	held      int  // bytes ReadBody held
	ctxAlive  bool // the request's context was not cancelled when it was forwarded
}

// bodyServer serves a handler that calls ReadBody and then reads r.Body as the upstream
// transport would; slow, when set, is closed as soon as ReadBody returns.
func bodyServer(t *testing.T, limit int64, timeout time.Duration, slow chan<- struct{}) (string, <-chan bodyResult) {
	t.Helper()
	results := make(chan bodyResult, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var res bodyResult
		res.read, res.err = ReadBody(r, limit, timeout)
		if slow != nil {
			close(slow)
		}
		res.forwarded, res.fwdErr = io.ReadAll(r.Body)
		if rb, ok := r.Body.(*replay); ok {
			res.held = len(rb.b.buf) // the replay never appends; its loop has ended
		}
		res.ctxAlive = r.Context().Err() == nil
		results <- res
	}))
	t.Cleanup(ts.Close)
	return ts.URL, results
}

func TestReadBodyWithinBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
	}{{"2 KB", 2 << 10, false}, {"at the bound", 64 << 10, false}, {"chunked, grown", 60 << 10, true}, {"empty", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			url, results := bodyServer(t, 64<<10, time.Minute, nil)
			body := bytes.Repeat([]byte("a"), tc.size)
			var rd io.Reader = bytes.NewReader(body)
			if tc.chunked {
				rd = struct{ io.Reader }{rd} // no length known to the client: chunked
			}
			res, err := http.Post(url, "application/json", rd)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			r := <-results
			if r.err != nil || !bytes.Equal(r.read, body) || !bytes.Equal(r.forwarded, body) || r.fwdErr != nil {
				t.Errorf("read %d bytes, %v; forwarded %d bytes, %v; want %d", len(r.read), r.err, len(r.forwarded), r.fwdErr, tc.size)
			}
		})
	}
}

// TestReadBodyOverTheBound: a body over the bound is refused for sizing, having held at most
// one byte past the bound (none when Content-Length said so), and is forwarded whole.
func TestReadBodyOverTheBound(t *testing.T) {
	const limit = 10 << 10
	for _, chunked := range []bool{false, true} {
		url, results := bodyServer(t, limit, time.Minute, nil)
		body := bytes.Repeat([]byte("0123456789"), 100<<10)
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = struct{ io.Reader }{rd}
		}
		res, err := http.Post(url, "application/json", rd)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		r := <-results
		if !errors.Is(r.err, ErrBodyTooLarge) || r.read != nil || !bytes.Equal(r.forwarded, body) {
			t.Errorf("chunked %v: error %v, read %d, forwarded %d of %d", chunked, r.err, len(r.read), len(r.forwarded), len(body))
		}
		if r.held > limit+1 || (!chunked && r.held != 0) {
			t.Errorf("chunked %v: held %d bytes, bound %d", chunked, r.held, limit)
		}
	}
}

// TestReadBodySlow: a client slower than the bound gets the request through whole: ReadBody
// gives up, and the request's context is still alive (a connection read deadline would have
// cancelled it), so the rest of the body reaches the upstream.
func TestReadBodySlow(t *testing.T) {
	slow := make(chan struct{})
	url, results := bodyServer(t, 1<<20, 20*time.Millisecond, slow)
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"messages":[`)
		<-slow // ReadBody gave up; only now comes the rest
		_, _ = io.WriteString(pw, `{"role":"user","content":"hi"}]}`)
		_ = pw.Close()
	}()
	res, err := http.Post(url, "application/json", pr)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	r := <-results
	want := `{"messages":[{"role":"user","content":"hi"}]}`
	if !errors.Is(r.err, ErrBodySlow) || string(r.forwarded) != want || r.fwdErr != nil || !r.ctxAlive {
		t.Errorf("error %v; forwarded %q, %v; context alive %v", r.err, r.forwarded, r.fwdErr, r.ctxAlive)
	}
}

// TestReadBodyBroken: a malformed chunked body is an error for sizing, and the upstream sees
// the bytes before the fault and then the same error.
func TestReadBodyBroken(t *testing.T) {
	url, results := bodyServer(t, 1<<20, time.Minute, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n")
	r := <-results
	if r.err == nil || errors.Is(r.err, ErrBodyTooLarge) || errors.Is(r.err, ErrBodySlow) ||
		string(r.forwarded) != "hello" || r.fwdErr == nil {
		t.Errorf("error %v; forwarded %q, %v", r.err, r.forwarded, r.fwdErr)
	}
	_, _ = bufio.NewReader(conn).ReadString('\n')
}

func TestReadBodyNone(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if b, err := ReadBody(r, 10, time.Second); b != nil || err != nil {
		t.Errorf("ReadBody of no body = %q, %v", b, err)
	}
}
