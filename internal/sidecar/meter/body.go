package meter

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// ErrBodyTooLarge is returned by ReadBody for a body over its bound.
var ErrBodyTooLarge = errors.New("meter: request body over the bound for sizing")

// ErrBodySlow is returned by ReadBody for a body not read within its time.
var ErrBodySlow = errors.New("meter: request body not read within the time for sizing")

// ErrNoMemory is returned by ReadBodyIn when its Memory refused the bytes the body needs: the
// request must not be sized or served (the proxy answers 503).
var ErrNoMemory = errors.New("meter: no memory left in the budget to read the request body")

// Memory is what a body read for sizing draws its buffer from (a lease of the sidecar's memory
// budget, membudget.Lease). Grow is asked for every byte before it is allocated; Release is
// called once the buffer has been handed on whole, or the body closed.
type Memory interface {
	Grow(n int64) bool
	Release()
}

// firstBuffer is the buffer a body of unknown length starts in; it doubles up to the bound.
const firstBuffer = 4 << 10

// ReadBody reads r's body for sizing a hold: at most limit bytes, within timeout (none when 0).
// It always leaves r.Body a body that gives the upstream every byte the client sent, in order:
// what was read, then the rest. On success it returns the whole body; a body over limit
// (ErrBodyTooLarge, found without reading when Content-Length says so), one slower than
// timeout (ErrBodySlow), or a read error returns an error, and the caller holds the rule's
// default and forwards the request as it is.
//
// At most limit+1 bytes are held (the one past limit is how an unknown length is found over it).
// The time bound is not a read deadline on the connection: net/http cancels the request's
// context on any connection read error, a deadline's too, which would fail the very request
// that was to go through. Reads run on their own goroutine instead, one at a time; at the
// time bound ReadBody returns, and the read under way finishes into the buffer, which the new
// body replays before it reads on from the client.
func ReadBody(r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	return ReadBodyIn(r, limit, timeout, nil)
}

// ReadBodyIn is ReadBody with the buffer drawn from mem (nil: drawn from nothing). The whole
// declared Content-Length is drawn before anything is read; a body of unknown length draws as
// its buffer grows. A draw refused returns ErrNoMemory, before any byte of a declared length
// is read (r.Body is then untouched) or after the bytes already drawn for (r.Body then replays
// them). The bytes go back to mem when the body left in r.Body has handed them on, or is
// closed; the slice returned stays valid, but the caller must not keep it past that.
func ReadBodyIn(r *http.Request, limit int64, timeout time.Duration, mem Memory) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if limit < 0 {
		limit = 0
	}
	if r.ContentLength > limit {
		return nil, ErrBodyTooLarge
	}
	size := int64(firstBuffer)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1 // room for the read that sees EOF
	}
	size = min(size, limit+1)
	if mem == nil {
		mem = nowhere{}
	}
	if !mem.Grow(size) {
		return nil, ErrNoMemory
	}
	b := &bodyRead{src: r.Body, mem: mem, buf: make([]byte, 0, size), max: limit, done: make(chan struct{})}
	if timeout <= 0 {
		b.loop()
	} else {
		go b.loop()
		t := time.NewTimer(timeout)
		select {
		case <-b.done:
			t.Stop()
		case <-t.C:
			b.stop.Store(true)
			r.Body = &replay{b: b}
			return nil, ErrBodySlow
		}
	}
	r.Body = &replay{b: b}
	switch b.err {
	case io.EOF:
		return b.buf, nil
	case errOver:
		return nil, ErrBodyTooLarge
	case errNoMemory:
		return nil, ErrNoMemory
	}
	return nil, fmt.Errorf("meter: reading the request body: %w", b.err)
}

// errOver ends a read loop that passed the bound.
var errOver = errors.New("over the bound")

// errNoMemory ends a read loop whose buffer could not grow: what it read is replayed.
var errNoMemory = errors.New("no memory to grow the buffer")

// nowhere is the Memory of a read that draws from nothing.
type nowhere struct{}

func (nowhere) Grow(int64) bool { return true }
func (nowhere) Release()        {}

// bodyRead is one bounded read of a body.
type bodyRead struct {
	src  io.ReadCloser
	mem  Memory
	max  int64
	stop atomic.Bool   // the caller gave up waiting: stop after the read under way
	done chan struct{} // closed when loop returns; then buf and err are the loop's
	buf  []byte
	err  error // io.EOF, errOver, errNoMemory, a read error, or nil when stopped
}

func (b *bodyRead) loop() {
	defer close(b.done)
	for !b.stop.Load() {
		if len(b.buf) == cap(b.buf) {
			size := min(2*int64(cap(b.buf))+1, b.max+1)
			if !b.mem.Grow(size - int64(cap(b.buf))) {
				b.err = errNoMemory
				return
			}
			grown := make([]byte, len(b.buf), size)
			copy(grown, b.buf)
			b.buf = grown
		}
		n, err := b.src.Read(b.buf[len(b.buf):cap(b.buf)])
		b.buf = b.buf[:len(b.buf)+n]
		switch {
		case int64(len(b.buf)) > b.max:
			b.err = errOver
			if err != nil && err != io.EOF {
				b.err = err
			}
			return
		case err != nil:
			b.err = err
			return
		}
	}
}

// replay is the body left for the upstream: the bytes read, then the rest from the client.
// Once the bytes read are handed on, it drops them and gives their memory back.
type replay struct {
	b      *bodyRead
	off    int
	waited bool
}

func (r *replay) Read(p []byte) (int, error) {
	if !r.waited {
		<-r.b.done // the read under way ends before the body is read again
		r.waited = true
	}
	if r.b.buf != nil {
		n := copy(p, r.b.buf[r.off:])
		r.off += n
		if r.off == len(r.b.buf) {
			r.b.buf = nil
			r.b.mem.Release()
		}
		if n > 0 {
			return n, nil
		}
	}
	switch r.b.err {
	case nil, errOver, errNoMemory:
		return r.b.src.Read(p)
	}
	return 0, r.b.err
}

// Close stops a read loop still running (after its read under way), gives the buffer's memory
// back and closes the client's body.
func (r *replay) Close() error {
	r.b.stop.Store(true)
	r.b.mem.Release()
	return r.b.src.Close()
}

// HeldBody is a request body of b whose memory mem gives back once b has been read whole, or
// the body closed: a body rewritten after its read for sizing, on its way to the upstream.
func HeldBody(b []byte, mem Memory) io.ReadCloser {
	if mem == nil {
		mem = nowhere{}
	}
	return &held{b: b, mem: mem}
}

type held struct {
	b   []byte
	mem Memory
}

func (h *held) Read(p []byte) (int, error) {
	if len(h.b) == 0 {
		h.drop()
		return 0, io.EOF
	}
	n := copy(p, h.b)
	h.b = h.b[n:]
	if len(h.b) == 0 {
		h.drop()
	}
	return n, nil
}

func (h *held) drop() {
	h.b = nil
	h.mem.Release()
}

func (h *held) Close() error {
	h.drop()
	return nil
}
