package helm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/docgen"
)

// Every metric the running manager and sidecars of the local stack serve, with policies
// programmed and pods injected, is in docs/reference/metrics.md, in its process's sections.
func TestLiveMetricsAreInTheReference(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, sidecars, targets := startE2EStack(ctx, t)
	md, err := os.ReadFile(filepath.Join("..", "..", docgen.Dir, "metrics.md"))
	if err != nil {
		t.Fatalf("reading metrics.md (run make docs): %v", err)
	}
	admin := map[string]bool{}
	for _, sc := range sidecars {
		admin[sc.AdminURL] = true
	}
	for addr := range targets {
		url := "http://" + addr
		sections := []string{"Manager", "Manager: libraries"}
		if admin[url] {
			sections = []string{"Sidecar", "Sidecar: libraries"}
		}
		live, err := scrapeNames(ctx, url+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if len(live) < 10 {
			t.Fatalf("%s serves %d metrics: %v", url, len(live), live)
		}
		if missing := docgen.Undocumented(string(md), live, sections...); len(missing) > 0 {
			t.Errorf("%s (%s) serves metrics that metrics.md lacks, run make docs: %v", url, sections[0], missing)
		}
	}
}

func scrapeNames(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	return docgen.ExpositionNames(string(body)), nil
}
