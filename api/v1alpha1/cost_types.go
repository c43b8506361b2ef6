package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CostSource says when a request's cost is known.
// +kubebuilder:validation:Enum=Request;Response
type CostSource string

// The cost sources.
const (
	// CostFromRequest charges every request one unit when it is decided: the rule counts
	// requests.
	CostFromRequest CostSource = "Request"
	// CostFromResponse holds an estimate sized from the request before it is forwarded and
	// settles it with what the response reports (tokens, for AI APIs): the rule counts units.
	CostFromResponse CostSource = "Response"
)

// CostUsage says where a response's usage is read.
// +kubebuilder:validation:Enum=Auto;OpenAIChat;OpenAIResponses;Anthropic;Gemini;Header
type CostUsage string

// The usage sources.
const (
	// UsageAuto reads the body of the API the request path names (/chat/completions,
	// /completions, /embeddings, /responses, /messages, :generateContent,
	// :streamGenerateContent, in any case); any other path is unsized (unsizedBody).
	UsageAuto CostUsage = "Auto"
	// UsageOpenAIChat reads bodies as OpenAI chat completions whatever the path.
	UsageOpenAIChat CostUsage = "OpenAIChat"
	// UsageOpenAIResponses reads bodies as OpenAI Responses whatever the path.
	UsageOpenAIResponses CostUsage = "OpenAIResponses"
	// UsageAnthropic reads bodies as Anthropic messages whatever the path.
	UsageAnthropic CostUsage = "Anthropic"
	// UsageGemini reads bodies as Gemini generateContent whatever the path.
	UsageGemini CostUsage = "Gemini"
	// UsageHeader reads no body: the cost is the header (or trailer) the application sets,
	// and the hold is defaultHold.
	UsageHeader CostUsage = "Header"
)

// CostOnError says what an upstream error, a timeout or a client abort is charged.
// +kubebuilder:validation:Enum=Used;Zero
type CostOnError string

// The error charges.
const (
	// OnErrorUsed charges the usage reported before the failure, or the whole hold when none
	// was: the budget never pays less than the upstream may have spent.
	OnErrorUsed CostOnError = "Used"
	// OnErrorZero gives the whole hold back: for upstreams that do not bill failed requests.
	OnErrorZero CostOnError = "Zero"
)

// UnsizedBody says what a request gets whose body cannot be sized.
// +kubebuilder:validation:Enum=Refuse;Hold
type UnsizedBody string

// The choices for a body that cannot be sized.
const (
	// UnsizedRefuse refuses the request with a 4xx that says why (too large, not JSON,
	// compressed, too slow, a path whose API the sidecar does not read, a count it does not
	// understand): the budget cannot be overshot by what the sidecar cannot see.
	UnsizedRefuse UnsizedBody = "Refuse"
	// UnsizedHold holds defaultHold and forwards the request as it was sent, with no output
	// cap written: the upstream may spend past the hold, charged afterwards as debt, and
	// within the window past the budget.
	UnsizedHold UnsizedBody = "Hold"
)

// Bounds and defaults of a Cost. The markers repeat them as literals; the controller checks
// them again for objects stored before a bound existed.
const (
	// DefaultCostHeader is the response header (or trailer) an application sets to report a
	// request's cost.
	DefaultCostHeader = "Redline-Cost"
	// MaxCostHeaderLength bounds cost.header.
	MaxCostHeaderLength = 64
	// DefaultHold is what a request holds when its body cannot be sized, unless the limit's
	// capacity is smaller (then the capacity).
	DefaultHold = 1000
	// DefaultMinOutput is the least output a request is let through with.
	DefaultMinOutput = 1
	// MaxCostUnits bounds defaultHold and minOutput, as MaxRequests bounds a limit.
	MaxCostUnits = 1_000_000_000
	// DefaultCostTimeout, MinCostTimeout and MaxCostTimeout bound how long a hold waits
	// for its settle.
	DefaultCostTimeout = time.Minute
	MinCostTimeout     = time.Second
	MaxCostTimeout     = time.Hour
)

// Cost says what one request takes from a rule's limit. Without it (or with from: Request)
// every request takes one unit when it is decided. With from: Response the limit counts units,
// such as tokens: before forwarding a request the sidecar holds an estimate sized from its
// body (the prompt's size plus its output cap, the cap lowered to what the budget has left),
// atomically in the same script as the counter, and after the response settles the hold with
// the usage the response reports; what was not used goes back. A hold not settled within
// timeout stays spent (its holder is taken for dead, and its stream may have been served). The rules that depend on the rule's algorithm and limit
// (which algorithm, defaultHold and minOutput within the capacity) are on Rule, where an
// algorithm left to its default is seen.
// The fields other than from apply with from: Response only.
// +kubebuilder:validation:XValidation:rule="!(has(self.unsizedBody) && self.unsizedBody == 'Refuse' && has(self.usage) && self.usage == 'Header')",message="cost.unsizedBody: Refuse cannot go with usage: Header, which reads no body: every request would be refused; leave unsizedBody unset"
type Cost struct {
	// from is Request (every request costs one unit, as without cost) or Response (the
	// response says what the request cost).
	// +kubebuilder:default=Request
	// +optional
	From CostSource `json:"from,omitempty"`

	// usage says where the response's usage is read: Auto (the default: the body of the API
	// the path names, only the header on any other path), OpenAIChat, OpenAIResponses,
	// Anthropic or Gemini (that API's body whatever the path) or Header (the header only, no
	// body is read). The header, when the response carries it, wins over a body's usage.
	// +kubebuilder:default=Auto
	// +optional
	Usage CostUsage `json:"usage,omitempty"`

	// header is the response header, or trailer, whose non-negative integer the application
	// sets to report the request's cost (Redline-Cost when not set). It is removed before the
	// response reaches the client. At most 64 characters of an HTTP token; not a hop-by-hop
	// or framing field, nor a field the sidecar writes itself.
	// +kubebuilder:default=Redline-Cost
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	// +kubebuilder:validation:XValidation:rule="!(self.lowerAscii() in ['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'content-length', 'content-encoding', 'content-type', 'content-range', 'ratelimit', 'ratelimit-policy', 'retry-after'])",message="cost.header must not be a hop-by-hop or framing field (Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade, Content-Length, Content-Encoding, Content-Type, Content-Range) nor one the sidecar writes (RateLimit, RateLimit-Policy, Retry-After): the sidecar removes it from every response; use a name of your own such as Redline-Cost"
	// +optional
	Header string `json:"header,omitempty"`

	// defaultHold is what a request holds when its body cannot be sized and unsizedBody is
	// Hold, and what every request holds under usage Header: 1000, or the limit's capacity when that
	// is smaller, when not set. Between 1 and 1000000000, and at most the limit's capacity
	// (limit.requests, or a TokenBucket's burst).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	DefaultHold *int64 `json:"defaultHold,omitempty"`

	// unsizedBody says what a request gets whose body the sidecar cannot size under a usage
	// that reads bodies: a body over 1 MiB, slower than 5s, compressed, not JSON, not of its
	// API's shape, with an output cap or stream flag in a form not understood, or on a path
	// the rule matches whose API the sidecar does not read. Refuse (the default) answers it
	// with a 4xx naming why (400, 408, 413 or 415), and a decision API reserve without a
	// size, or an Envoy descriptor (which never carries one), is refused too. Hold holds
	// defaultHold and forwards it as sent, with no output cap: the upstream may then spend
	// what the client asked, past the budget within the window. With usage: Header no body is
	// read, every request holds defaultHold, and this must be left unset or Hold.
	// +optional
	UnsizedBody UnsizedBody `json:"unsizedBody,omitempty"`

	// minOutput is the least output (in units) a request is let through with: a request
	// whose prompt leaves less than this of the budget is refused with 429 and Retry-After,
	// rather than sent with a cap the model cannot answer within. Between 0 and 1000000000,
	// at most the limit's capacity.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	MinOutput *int64 `json:"minOutput,omitempty"`

	// onError says what an upstream error, a timeout or a client abort is charged: Used (the
	// default: the usage reported before it, else the whole hold) or Zero (nothing).
	// +kubebuilder:default=Used
	// +optional
	OnError CostOnError `json:"onError,omitempty"`

	// timeout is how long a hold waits for its settle before it is taken as spent in full
	// (its holder dead), between 1s and 1h (60s when not set), in Go's duration syntax. A
	// settle after it still gives back what was not used. Set it above the longest response
	// the upstream streams: past it a hold no longer counts toward the key's bound of open
	// holds.
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$')",message="cost.timeout must be a duration such as 30s, 5m or 1h, with units h, m, s, ms, us or ns"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || (duration(self) >= duration('1s') && duration(self) <= duration('1h'))",message="cost.timeout must be between 1s and 1h"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}
