package main

import (
	"fmt"
	"time"

	"github.com/redline-dev/redline/internal/tokens"
)

// sizingCell is one step of the budget path's work on a request body, timed in this process.
type sizingCell struct {
	size int
	step string
	took []time.Duration
}

// measureSizing times what the budget path does with a body once it is read, n times per
// size on one goroutine: tokens.ScanRequest (the prompt's estimate and the caps) and
// tokens.SetOutputCap (the body rewritten with the cap the hold affords), on the same
// requests as the end-to-end section. With the read, these are the body's share of the
// budget's added latency; the rest is the hold's Redis call.
func measureSizing(n int) ([]sizingCell, error) {
	var cells []sizingCell
	for _, size := range bodySizes {
		_, body := latencyCall(size)
		scan := sizingCell{size: size, step: "tokens.ScanRequest"}
		set := sizingCell{size: size, step: "tokens.SetOutputCap"}
		for i := range n + warmUp {
			start := time.Now()
			req, err := tokens.ScanRequest(body, tokens.OpenAIChat, false)
			d := time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("ScanRequest of %d bytes: %w", len(body), err)
			}
			start = time.Now()
			_, err = tokens.SetOutputCap(body, tokens.OpenAIChat, max(req.OutputCap-1, 1), false)
			d2 := time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("SetOutputCap of %d bytes: %w", len(body), err)
			}
			if i >= warmUp {
				scan.took, set.took = append(scan.took, d), append(set.took, d2)
			}
		}
		cells = append(cells, scan, set)
	}
	return cells, nil
}
