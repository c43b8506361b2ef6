package compile

import (
	"errors"
	"fmt"
	"strings"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// compileCost resolves a rule's cost into the document's form, every default filled in, for
// the rule out compiled so far (algorithm, limit and candidate). A cost from the request (or
// none) compiles to nil: the document a previous sidecar reads. The schema checks the same;
// objects stored before it did meet the checks here.
func compileCost(c *v1alpha1.Cost, out *policydoc.Rule) (*policydoc.Cost, error) {
	if c == nil {
		return nil, nil
	}
	switch c.From {
	case "", v1alpha1.CostFromRequest:
		return nil, nil
	case v1alpha1.CostFromResponse:
	default:
		return nil, fmt.Errorf("cost.from %q must be Request or Response", c.From)
	}
	if out.CountRefused {
		return nil, errors.New("refused: Counted cannot go with cost.from: Response: a refused request's hold always goes back; leave refused unset")
	}
	if out.Candidate != nil {
		return nil, errors.New("cost.from: Response cannot have a candidate (not supported yet): remove the candidate")
	}
	capacity := out.Capacity()
	usage := orDefault(c.Usage, v1alpha1.UsageAuto)
	switch usage {
	case v1alpha1.UsageAuto, v1alpha1.UsageOpenAIChat, v1alpha1.UsageOpenAIResponses, v1alpha1.UsageAnthropic, v1alpha1.UsageGemini, v1alpha1.UsageHeader:
	default:
		return nil, fmt.Errorf("cost.usage %q must be Auto, OpenAIChat, OpenAIResponses, Anthropic, Gemini or Header", c.Usage)
	}
	onError := orDefault(c.OnError, v1alpha1.OnErrorUsed)
	if onError != v1alpha1.OnErrorUsed && onError != v1alpha1.OnErrorZero {
		return nil, fmt.Errorf("cost.onError %q must be Used or Zero", c.OnError)
	}
	header := orDefault(c.Header, v1alpha1.DefaultCostHeader)
	if err := policydoc.CheckCostHeader(header); err != nil {
		return nil, fmt.Errorf("cost.%w", err)
	}
	hold := min(int64(v1alpha1.DefaultHold), capacity)
	if c.DefaultHold != nil {
		hold = *c.DefaultHold
	}
	if hold < 1 || hold > min(v1alpha1.MaxCostUnits, capacity) {
		return nil, fmt.Errorf("cost.defaultHold %d must be between 1 and the limit's capacity %d (limit.requests, or limit.burst of a TokenBucket)", hold, capacity)
	}
	minOutput := int64(v1alpha1.DefaultMinOutput)
	if c.MinOutput != nil {
		minOutput = *c.MinOutput
	}
	if minOutput < 0 || minOutput > min(v1alpha1.MaxCostUnits, capacity) {
		return nil, fmt.Errorf("cost.minOutput %d must be between 0 and the limit's capacity %d (limit.requests, or limit.burst of a TokenBucket)", minOutput, capacity)
	}
	timeout := v1alpha1.DefaultCostTimeout
	if c.Timeout != nil {
		timeout = c.Timeout.Duration
	}
	if timeout < v1alpha1.MinCostTimeout || timeout > v1alpha1.MaxCostTimeout {
		return nil, fmt.Errorf("cost.timeout %s must be between 1s and 1h", timeout)
	}
	// Refuse unless the rule says Hold; usage Header reads no body, so it holds (an explicit
	// Refuse with it is an error, not a rule that refuses everything).
	unsized := policydoc.UnsizedRefuse
	switch c.UnsizedBody {
	case "":
		if usage == v1alpha1.UsageHeader {
			unsized = ""
		}
	case v1alpha1.UnsizedRefuse:
		if usage == v1alpha1.UsageHeader {
			return nil, errors.New("cost.unsizedBody: Refuse cannot go with usage: Header, which reads no body: leave unsizedBody unset")
		}
	case v1alpha1.UnsizedHold:
		unsized = ""
	default:
		return nil, fmt.Errorf("cost.unsizedBody %q must be Refuse or Hold", c.UnsizedBody)
	}
	return &policydoc.Cost{
		From: policydoc.CostFromResponse, Usage: string(usage), Header: strings.ToLower(header),
		DefaultHold: hold, MinOutput: minOutput, OnError: string(onError), TimeoutMS: timeout.Milliseconds(),
		UnsizedBody: unsized,
	}, nil
}
