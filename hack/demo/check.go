package main

import (
	"errors"
	"fmt"
	"math"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

// checkPhase fails when Prometheus's count of a phase differs from the client's: per pod,
// admitted must equal the 2xx the client saw and refused the 429s (one rule matches each
// request, so one decision per request), and a pod the client sent through must show up.
// During the Redis outage every pod's breaker must have been open and LocalFallback must have
// decided; while Redis is healthy (the phases before the outage) nothing may fall back.
func checkPhase(p timeline.Phase, pods []string) error {
	var errs []error
	for _, pod := range pods {
		ca, cr := p.Stats.ClientAdmitted[pod], p.Stats.ClientRefused[pod]
		if ca+cr == 0 {
			errs = append(errs, fmt.Errorf("the client sent no request through pod %s", pod))
		}
		if pa := p.Stats.Admitted[pod]; pa != float64(ca) {
			errs = append(errs, fmt.Errorf("pod %s: Prometheus counts %v admitted, the client %d", pod, pa, ca))
		}
		if pr := p.Stats.Refused[pod]; pr != float64(cr) {
			errs = append(errs, fmt.Errorf("pod %s: Prometheus counts %v refused, the client %d", pod, pr, cr))
		}
	}
	switch p.Name {
	case phaseOutage:
		if p.Stats.Fallback <= 0 {
			errs = append(errs, fmt.Errorf("no fallback decisions (%s)", fallbackQuery))
		}
		if p.Stats.BreakerOpen != float64(len(pods)) {
			errs = append(errs, fmt.Errorf("the breaker was open on %v of %d pods (%s)", p.Stats.BreakerOpen, len(pods), breakerQuery(1)))
		}
	case phaseBaseline, phaseChange:
		if p.Stats.Fallback != 0 || p.Stats.BreakerOpen != 0 {
			errs = append(errs, fmt.Errorf("%v fallback decisions and %v open breakers with Redis up", p.Stats.Fallback, p.Stats.BreakerOpen))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("what Prometheus returned for phase %q: %w", p.Name, err)
	}
	return nil
}

// checkSeriesTotals fails unless every pod has an admitted and a refused series whose
// per-second values add up to the phases' totals: the picture shows the same decisions as
// the table.
func checkSeriesTotals(d *timeline.Data, pods []string) error {
	var errs []error
	for _, result := range []string{timeline.Admitted, timeline.Refused} {
		byPod := map[string]timeline.Series{}
		for _, s := range d.Of(result) {
			byPod[s.Pod] = s
		}
		for _, pod := range pods {
			want := 0.0
			for _, p := range d.Phases {
				if result == timeline.Admitted {
					want += p.Stats.Admitted[pod]
				} else {
					want += p.Stats.Refused[pod]
				}
			}
			s, ok := byPod[pod]
			if !ok {
				errs = append(errs, fmt.Errorf("no %s series for pod %s", result, pod))
				continue
			}
			got := 0.0
			for _, pt := range s.Points {
				got += pt.V
			}
			if math.Abs(got-want) > 0.5 {
				errs = append(errs, fmt.Errorf("%s per second of pod %s adds up to %.1f, the phases to %.0f", result, pod, got, want))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prometheus's query_range: %w", err)
	}
	return nil
}
