package sidecarproc

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestScrape(t *testing.T) {
	g := NewWithT(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "# HELP a_total x\na_total 12\nb_total{p=\"x\"} 3\nb_total 4.5\n")
	}))
	defer srv.Close()
	m, err := Scrape(context.Background(), srv.URL, "a_total", "b_total")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).To(Equal(map[string]float64{"a_total": 12, "b_total": 4.5}), "labelled samples are other series")
	_, err = Scrape(context.Background(), srv.URL, "a_total", "c_total")
	g.Expect(err).To(MatchError(ContainSubstring("metric c_total missing")))
}

func TestCPUTime(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("CPUTime of this process: %v", err)
	}
	// Spin until the kernel's own account (getrusage) says this process used 100ms more CPU:
	// wall time would say nothing on a loaded machine, where 100ms of it can be 20ms of CPU.
	ref := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatalf("getrusage: %v", err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for start := ref(); ref()-start < 100*time.Millisecond; {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("CPUTime of this process: %v", err)
	}
	if after-before < 80*time.Millisecond { // /proc counts in clock ticks (10ms)
		t.Errorf("100ms of CPU by getrusage counted %s by CPUTime", after-before)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
