package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// naiveLimiter is what Redline replaces: a rate limiter inside one replica, counting in its
// own memory (a fixed window per key). Each replica is right about itself and wrong about the
// service: three of them admit three times the limit.
type naiveLimiter struct {
	limit  int
	window time.Duration
	header string
	next   http.Handler

	mu     sync.Mutex
	counts map[string]int
	start  time.Time
}

func (l *naiveLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(l.header)
	now := time.Now()
	l.mu.Lock()
	if now.Sub(l.start) >= l.window {
		l.start, l.counts = now, map[string]int{}
	}
	l.counts[key]++
	over := l.counts[key] > l.limit
	l.mu.Unlock()
	if over {
		http.Error(w, "rate limited (local counter)", http.StatusTooManyRequests)
		return
	}
	l.next.ServeHTTP(w, r)
}

// startNaiveReplicas starts n naive limiters on loopback in front of upstream, as n replicas
// with in-memory limits would be, and returns their base URLs and a function that stops them.
func startNaiveReplicas(n, limit int, window time.Duration, header, upstream string) ([]string, func(), error) {
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing upstream address: %w", err)
	}
	var urls []string
	var servers []*http.Server
	stop := func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("listening for a naive replica: %w", err)
		}
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: &naiveLimiter{
			limit: limit, window: window, header: header, next: httputil.NewSingleHostReverseProxy(target),
		}}
		go func() { _ = srv.Serve(ln) }()
		servers = append(servers, srv)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	return urls, stop, nil
}
