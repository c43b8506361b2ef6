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
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// bodyResult is what a handler saw: ReadBody's answer, then what the upstream would read.
type bodyResult struct {
	read      []byte
	err       error
	forwarded []byte
	fwdErr    error
	held      int64 // bytes ReadBody drew for its buffer
	ctxAlive  bool  // the request's context was not cancelled when it was forwarded
	// inUse is what the budget held when ReadBody returned, then once the body was forwarded.
	inUse, inUseAfter int64
}

// drawn is a lease that remembers what was drawn from it.
type drawn struct {
	*membudget.Lease
	n atomic.Int64
}

func (d *drawn) Grow(n int64) bool {
	if !d.Lease.Grow(n) {
		return false
	}
	d.n.Add(n)
	return true
}

// bodyServer serves a handler that calls ReadBody and then reads r.Body as the upstream
// transport would; slow, when set, is closed as soon as ReadBody returns.
func bodyServer(t *testing.T, limit int64, timeout time.Duration, slow chan<- struct{}) (string, <-chan bodyResult) {
	return bodyServerIn(t, limit, timeout, slow, nil)
}

// bodyServerIn is bodyServer with the buffer drawn from budget (nil: none).
func bodyServerIn(t *testing.T, limit int64, timeout time.Duration, slow chan<- struct{}, budget *membudget.Budget) (string, <-chan bodyResult) {
	t.Helper()
	results := make(chan bodyResult, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var res bodyResult
		lease, _ := budget.Take(0)
		mem := &drawn{Lease: lease}
		res.read, res.err = ReadBodyIn(r, limit, timeout, mem)
		res.inUse = budget.Stats().InUse
		if slow != nil {
			close(slow)
		}
		res.forwarded, res.fwdErr = io.ReadAll(r.Body)
		_ = r.Body.Close()
		res.held = mem.n.Load()
		res.inUseAfter = budget.Stats().InUse
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

// TestReadBodyDrawsFromTheBudget: the buffer is drawn from the budget before it is allocated,
// a body the budget has no room for is refused (ErrNoMemory) yet reaches the upstream whole
// if sent on, and the draw goes back once the body has been handed on.
func TestReadBodyDrawsFromTheBudget(t *testing.T) {
	const room = 8 << 10
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		fits    bool
	}{{"declared, fits", 4 << 10, false, true}, {"declared, too big", 16 << 10, false, false},
		{"chunked, fits", 2 << 10, true, true}, {"chunked, too big", 16 << 10, true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			budget := membudget.New(room)
			url, results := bodyServerIn(t, 64<<10, time.Minute, nil, budget)
			body := bytes.Repeat([]byte("a"), tc.size)
			var rd io.Reader = bytes.NewReader(body)
			if tc.chunked {
				rd = struct{ io.Reader }{rd}
			}
			res, err := http.Post(url, "application/json", rd)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			r := <-results
			if !bytes.Equal(r.forwarded, body) || r.fwdErr != nil {
				t.Errorf("forwarded %d bytes, %v; want all %d", len(r.forwarded), r.fwdErr, tc.size)
			}
			switch {
			case tc.fits && (r.err != nil || !bytes.Equal(r.read, body)):
				t.Errorf("read %d bytes, %v; want the body", len(r.read), r.err)
			case !tc.fits && (!errors.Is(r.err, ErrNoMemory) || r.read != nil):
				t.Errorf("read %d bytes, %v; want ErrNoMemory", len(r.read), r.err)
			}
			if r.held > room || r.inUse != r.held || (!tc.fits && !tc.chunked && r.held != 0) {
				t.Errorf("drew %d bytes (%d in use) from a budget of %d", r.held, r.inUse, room)
			}
			if r.inUseAfter != 0 {
				t.Errorf("%d bytes still drawn after the body was handed on", r.inUseAfter)
			}
			if st := budget.Stats(); tc.fits == (st.Refused > 0) {
				t.Errorf("budget refused %d draws", st.Refused)
			}
		})
	}
}

// TestHeldBodyGivesItsMemoryBack: a rewritten body gives its draw back once read whole, or
// closed unread.
func TestHeldBodyGivesItsMemoryBack(t *testing.T) {
	budget := membudget.New(1 << 10)
	for _, read := range []bool{true, false} {
		lease, ok := budget.Take(100)
		if !ok {
			t.Fatal("a budget of 1 KiB refused 100 bytes")
		}
		b := HeldBody(bytes.Repeat([]byte("x"), 100), lease)
		if read {
			got, err := io.ReadAll(b)
			if len(got) != 100 || err != nil {
				t.Fatalf("read %d bytes, %v", len(got), err)
			}
		} else {
			_ = b.Close()
		}
		if n := budget.Stats().InUse; n != 0 {
			t.Errorf("read %v: %d bytes still drawn", read, n)
		}
	}
}
