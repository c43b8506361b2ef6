// Command echo is the application of the cluster suite's workload: it answers every method and
// path with 200 and the name of its pod, and counts what it served, so that the suite sees what
// reached an application behind its sidecar. GET /served (which the sidecar's policy does not
// match) returns the count; GET /served?key=K the count of those that carried X-API-Key K (the
// first maxKeys keys seen are counted apart). On SIGTERM it does what a well-behaved application behind a Service
// does: it serves on for a few seconds, while the endpoint's removal reaches kube-proxy, then
// shuts down gracefully.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxKeys bounds the API keys counted apart.
const maxKeys = 1024

// byKey counts what was served by X-API-Key.
type byKey struct {
	mu sync.Mutex
	n  map[string]int64
}

func (b *byKey) add(key string) {
	if key == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.n[key]; ok || len(b.n) < maxKeys {
		b.n[key]++
	}
}

func (b *byKey) get(key string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[key]
}

func main() {
	listen := flag.String("listen", ":8080", "address to serve")
	drain := flag.Duration("drain", 5*time.Second, "how long to serve on after SIGTERM")
	flag.Parse()
	pod := os.Getenv("POD_NAME")
	var served atomic.Int64
	keys := &byKey{n: map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /served", func(w http.ResponseWriter, r *http.Request) {
		n := served.Load()
		if r.URL.Query().Has("key") {
			n = keys.get(r.URL.Query().Get("key"))
		}
		_, _ = w.Write([]byte(strconv.FormatInt(n, 10)))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		keys.add(r.Header.Get("X-API-Key"))
		_, _ = fmt.Fprintln(w, pod)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		time.Sleep(*drain)
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		slog.Error("serving", "err", err)
		os.Exit(1)
	}
}
