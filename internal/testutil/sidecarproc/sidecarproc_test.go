package sidecarproc

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
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
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("CPUTime of this process: %v", err)
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("100ms of spinning counted %s of CPU", after-before)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
