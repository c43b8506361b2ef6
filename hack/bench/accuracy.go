package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
)

// algorithms are the four algorithms' names as the API spells them.
var algorithms = func() []string {
	out := make([]string, len(limiter.Algorithms))
	for i, a := range limiter.Algorithms {
		out[i] = string(a)
	}
	return out
}()

// AccuracyCell is one algorithm at one replica count: how many requests the replicas admitted
// together against one shared limit.
type AccuracyCell struct {
	Algorithm string `json:"algorithm"`
	Replicas  int    `json:"replicas"`
	Limit     int    `json:"limit"`
	Sent      int64  `json:"sent"`
	Admitted  int64  `json:"admitted"`
	// Degraded counts decisions the failure mode (Closed: refuse) made instead of Redis.
	Degraded int64         `json:"degraded"`
	Elapsed  time.Duration `json:"elapsedNs"`
}

// runAccuracy sends sentFactor times the limit, round-robin over the first n sidecars for each
// n in replicaCounts, through /v1/check, 16 at a time, on one key per cell.
func runAccuracy(ctx context.Context, sidecars []*Sidecar, replicaCounts []int, sentFactor int) ([]AccuracyCell, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	var out []AccuracyCell
	for _, n := range replicaCounts {
		if n > len(sidecars) {
			return nil, fmt.Errorf("%d replicas wanted, %d sidecars running", n, len(sidecars))
		}
		for _, alg := range algorithms {
			cell := AccuracyCell{Algorithm: alg, Replicas: n, Limit: accLimit, Sent: int64(sentFactor * accLimit)}
			key := fmt.Sprintf("accuracy-%d-%s-%d", n, alg, time.Now().UnixNano())
			var admitted, degraded atomic.Int64
			rule := strings.ToLower(alg)
			start := time.Now()
			_, err := closedLoop(ctx, 16, Bounds{MaxOps: cell.Sent, MaxTime: 30 * time.Second}, func(ctx context.Context, i int64) error {
				r, err := check(ctx, hc, sidecars[i%int64(n)], rule, key)
				if err != nil {
					return err
				}
				if r.Allowed {
					admitted.Add(1)
				}
				if len(r.Results) > 0 && r.Results[0].Source != "redis" && r.Results[0].Source != "precheck" && r.Results[0].Source != "lease" {
					degraded.Add(1)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("accuracy of %s with %d replicas: %w", alg, n, err)
			}
			cell.Elapsed = time.Since(start)
			cell.Admitted, cell.Degraded = admitted.Load(), degraded.Load()
			progress("  %-21s %2d replicas: sent %d, admitted %d of limit %d (degraded %d)",
				alg, n, cell.Sent, cell.Admitted, cell.Limit, cell.Degraded)
			out = append(out, cell)
		}
	}
	return out, nil
}

// check asks sidecar s through /v1/check for one unit of rule's limit on key.
func check(ctx context.Context, hc *http.Client, s *Sidecar, rule, key string) (checkapi.Response, error) {
	body, err := json.Marshal(checkapi.Request{Policy: accPolicy, Rule: rule, Key: []string{key}})
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("encoding the check: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Check+checkapi.Path, strings.NewReader(string(body)))
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("building the check: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("POST %s: %w", checkapi.Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return checkapi.Response{}, fmt.Errorf("POST %s: status %d", checkapi.Path, resp.StatusCode)
	}
	var r checkapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return checkapi.Response{}, fmt.Errorf("decoding the decision: %w", err)
	}
	return r, nil
}
