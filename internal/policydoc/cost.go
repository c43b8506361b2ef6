package policydoc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Cost is a rule's cost that comes from the response: the request holds an estimate before it
// is forwarded, and the usage its response reports settles the hold. Every field is resolved
// (no defaults left to the reader), so that the sidecars of one release cannot disagree about
// a default.
type Cost struct {
	// From is CostFromResponse, the only source that needs a Cost (a request that costs one
	// unit has none).
	From string `json:"from"`
	// Usage is one of the Usage* values.
	Usage string `json:"usage"`
	// Header is the response header or trailer the application reports the cost in,
	// lowercased as the document's other header names.
	Header string `json:"header"`
	// DefaultHold is what a request holds when its body cannot be sized, 1 to
	// MaxCostUnits and at most the rule's capacity.
	DefaultHold int64 `json:"defaultHold"`
	// MinOutput is the least output a request is let through with, 0 to MaxCostUnits and
	// at most the rule's capacity.
	MinOutput int64 `json:"minOutput"`
	// OnError is OnErrorUsed or OnErrorZero.
	OnError string `json:"onError"`
	// TimeoutMS is how long a hold waits for its settle, MinCostTimeoutMS to
	// MaxCostTimeoutMS.
	TimeoutMS int64 `json:"timeoutMs"`
	// UnsizedBody is UnsizedRefuse, or empty: a request whose body cannot be sized holds
	// DefaultHold (the previous release's behaviour, which its sidecars keep; they refuse a
	// document with the field, so a rule that refuses is never enforced as one that holds).
	// Never UnsizedRefuse with UsageHeader, which sizes no body.
	UnsizedBody string `json:"unsizedBody,omitempty"`
}

// Values of Cost's fields: the API's enum values, written as they are.
const (
	CostFromResponse = "Response"

	UsageAuto            = "Auto"
	UsageOpenAIChat      = "OpenAIChat"
	UsageOpenAIResponses = "OpenAIResponses"
	UsageAnthropic       = "Anthropic"
	UsageGemini          = "Gemini"
	UsageHeader          = "Header"

	OnErrorUsed = "Used"
	OnErrorZero = "Zero"

	UnsizedRefuse = "Refuse"
)

// Bounds of a Cost, the API's (api/v1alpha1 repeats them; the controller's tests hold the two
// equal).
const (
	MaxCostUnits        = 1_000_000_000
	MaxCostHeaderLength = 64
	MinCostTimeoutMS    = 1_000
	MaxCostTimeoutMS    = 3_600_000
)

const (
	algTokenBucket = "TokenBucket"
	// headerTokenPunct are the punctuation characters of an HTTP token the API's header
	// patterns take (RFC 9110's, less the backquote).
	headerTokenPunct = "!#$%&'*+-.^_|~"
)

// ReservedCostHeaders are the header names a cost header may not take, lowercased: the
// sidecar removes the cost header from every response, so it must not be a field that frames
// or routes the response (hop-by-hop and content fields) nor one the sidecar writes itself.
// The API's schema refuses the same names (api/v1alpha1, Cost.Header).
var ReservedCostHeaders = []string{
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
	"te", "trailer", "transfer-encoding", "upgrade",
	"content-length", "content-encoding", "content-type", "content-range",
	"ratelimit", "ratelimit-policy", "retry-after",
}

// CheckCostHeader reports what is wrong with name as a cost header: empty, too long, not an
// HTTP token, or reserved (ReservedCostHeaders). Case does not matter.
func CheckCostHeader(name string) error {
	switch {
	case name == "":
		return errors.New("header is empty")
	case len(name) > MaxCostHeaderLength:
		return fmt.Errorf("header %.64q... is longer than %d characters", name, MaxCostHeaderLength)
	case strings.IndexFunc(name, func(c rune) bool { return !isTokenChar(c) }) >= 0:
		return fmt.Errorf("header %q is not an HTTP field name (letters, digits and %s)", name, headerTokenPunct)
	case slices.Contains(ReservedCostHeaders, strings.ToLower(name)):
		return fmt.Errorf("header %q is a hop-by-hop or framing field, or one the sidecar writes; the sidecar removes the cost header from every response", name)
	}
	return nil
}

func isTokenChar(c rune) bool {
	return c < 0x80 && ('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.ContainsRune(headerTokenPunct, c))
}

// Capacity is the most units the rule's limit can grant at once: a TokenBucket's burst, else
// its requests.
func (r *Rule) Capacity() int64 {
	if r.Algorithm == algTokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Requests
}

// validCost checks a rule's cost as strictly as the controller compiles it (nil is valid).
func (r *Rule) validCost() error {
	c := r.Cost
	if c == nil {
		return nil
	}
	switch {
	case c.From != CostFromResponse:
		return fmt.Errorf("from %q is not %s", c.From, CostFromResponse)
	case r.Candidate != nil:
		return errors.New("a rule whose cost comes from the response has no candidate")
	case r.CountRefused:
		return errors.New("a rule whose cost comes from the response does not count refused requests")
	case !slices.Contains([]string{UsageAuto, UsageOpenAIChat, UsageOpenAIResponses, UsageAnthropic, UsageGemini, UsageHeader}, c.Usage):
		return fmt.Errorf("unknown usage %q", c.Usage)
	case c.OnError != OnErrorUsed && c.OnError != OnErrorZero:
		return fmt.Errorf("unknown onError %q", c.OnError)
	case c.DefaultHold < 1 || c.DefaultHold > min(MaxCostUnits, r.Capacity()):
		return fmt.Errorf("defaultHold %d is not between 1 and the capacity %d", c.DefaultHold, min(MaxCostUnits, r.Capacity()))
	case c.MinOutput < 0 || c.MinOutput > min(MaxCostUnits, r.Capacity()):
		return fmt.Errorf("minOutput %d is not between 0 and the capacity %d", c.MinOutput, min(MaxCostUnits, r.Capacity()))
	case c.TimeoutMS < MinCostTimeoutMS || c.TimeoutMS > MaxCostTimeoutMS:
		return fmt.Errorf("timeoutMs %d is not between %d and %d", c.TimeoutMS, MinCostTimeoutMS, MaxCostTimeoutMS)
	case c.UnsizedBody != "" && c.UnsizedBody != UnsizedRefuse:
		return fmt.Errorf("unknown unsizedBody %q", c.UnsizedBody)
	case c.UnsizedBody == UnsizedRefuse && c.Usage == UsageHeader:
		return errors.New("unsizedBody Refuse with usage Header would refuse every request")
	case c.Header != strings.ToLower(c.Header):
		return fmt.Errorf("header %q is not lowercased", c.Header)
	}
	return CheckCostHeader(c.Header)
}
