package redistest

import (
	"net"
	"strconv"
	"sync"
)

// Recorder is a TCP listener on loopback posing as a Redis server an attacker runs: it
// accepts connections, records every byte clients send, and answers nothing. A test points
// Sentinel at it and checks that no credential ever arrived.
type Recorder struct {
	ln net.Listener

	mu    sync.Mutex
	data  []byte
	conns int
	wg    sync.WaitGroup
}

// StartRecorder listens on a free loopback port.
func StartRecorder() (*Recorder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Recorder{ln: ln}
	r.wg.Go(r.accept)
	return r, nil
}

func (r *Recorder) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.conns++
		r.mu.Unlock()
		r.wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				r.mu.Lock()
				r.data = append(r.data, buf[:n]...)
				r.mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
}

// Host and Port are where the recorder listens.
func (r *Recorder) Host() string { return "127.0.0.1" }

// Port is the recorder's port.
func (r *Recorder) Port() string {
	return strconv.Itoa(r.ln.Addr().(*net.TCPAddr).Port)
}

// Received returns every byte received so far and how many connections were accepted.
func (r *Recorder) Received() (data []byte, conns int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.data...), r.conns
}

// Close stops listening; connections still open end when their clients close them.
func (r *Recorder) Close() error { return r.ln.Close() }
