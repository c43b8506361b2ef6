// Command echo is the application of the cluster suite's workload: it answers every method and
// path with 200 and the name of its pod, and counts what it served, so that the suite sees what
// reached an application behind its sidecar. GET /served (which the sidecar's policy does not
// match) returns the count.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve")
	flag.Parse()
	pod := os.Getenv("POD_NAME")
	var served atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /served", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strconv.FormatInt(served.Load(), 10)))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = fmt.Fprintln(w, pod)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("serving", "err", err)
		os.Exit(1)
	}
}
