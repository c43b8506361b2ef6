package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Algorithm is the counting algorithm of a rule.
// +kubebuilder:validation:Enum=FixedWindow;SlidingWindowLog;SlidingWindowCounter;TokenBucket
type Algorithm string

// The algorithms a rule can use.
const (
	// FixedWindow counts requests per aligned window. Cheapest; admits up to twice the limit
	// across a window boundary.
	FixedWindow Algorithm = "FixedWindow"
	// SlidingWindowLog keeps one entry per admitted request. Exact; memory grows with the limit.
	SlidingWindowLog Algorithm = "SlidingWindowLog"
	// SlidingWindowCounter weights the previous window by the part of it still inside the
	// sliding window. Close to exact at the cost of two counters.
	SlidingWindowCounter Algorithm = "SlidingWindowCounter"
	// TokenBucket refills requests/window tokens continuously up to burst.
	TokenBucket Algorithm = "TokenBucket"
)

// FailureMode says what a sidecar does when Redis cannot answer.
// +kubebuilder:validation:Enum=Open;Closed;LocalFallback
type FailureMode string

// The failure modes.
const (
	// FailureModeOpen admits every request while Redis is unavailable.
	FailureModeOpen FailureMode = "Open"
	// FailureModeClosed refuses every request while Redis is unavailable.
	FailureModeClosed FailureMode = "Closed"
	// FailureModeLocalFallback enforces limit / live replicas in each sidecar while Redis is unavailable.
	FailureModeLocalFallback FailureMode = "LocalFallback"
)

// Mode says whether a rule's decisions are applied.
// +kubebuilder:validation:Enum=Enforce;Shadow
type Mode string

// The rule modes.
const (
	// Enforce refuses requests over the limit.
	Enforce Mode = "Enforce"
	// Shadow decides and counts, but always admits: for trying a limit on live traffic.
	Shadow Mode = "Shadow"
)

// Attribute is a request attribute that can be part of a rate limit key.
// +kubebuilder:validation:Enum=RemoteAddress;ForwardedFor;Path;Method
type Attribute string

// The request attributes usable in keys.
const (
	// RemoteAddress is the client IP of the connection.
	RemoteAddress Attribute = "RemoteAddress"
	// ForwardedFor is the client IP taken from X-Forwarded-For behind the sidecar's trusted hops.
	ForwardedFor Attribute = "ForwardedFor"
	// Path is the request path, without the query.
	Path Attribute = "Path"
	// Method is the HTTP method.
	Method Attribute = "Method"
)

// HeadersMode says when a sidecar's proxy adds the RateLimit header fields to responses.
// +kubebuilder:validation:Enum=Always;OnRefusal
type HeadersMode string

// The headers modes.
const (
	// HeadersAlways adds RateLimit-Policy and RateLimit to admitted and refused responses.
	HeadersAlways HeadersMode = "Always"
	// HeadersOnRefusal adds them to 429 responses only, for APIs that do not want to publish
	// their limits to clients in good standing.
	HeadersOnRefusal HeadersMode = "OnRefusal"
)

// HTTPMethod is an HTTP request method.
// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS;CONNECT;TRACE
type HTTPMethod string

// RateLimitPolicySpec is the desired limiting of the pods a policy targets.
type RateLimitPolicySpec struct {
	// targetSelector selects, by label, the pods of this namespace whose sidecars enforce this
	// policy. An empty selector selects every injected pod of the namespace.
	// +required
	TargetSelector metav1.LabelSelector `json:"targetSelector"`

	// failureMode says what sidecars do while Redis is unavailable: Open admits, Closed refuses,
	// LocalFallback enforces limit / live replicas in each pod.
	// +kubebuilder:default=LocalFallback
	// +optional
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// rateLimitHeaders says when the proxy adds the RateLimit-Policy and RateLimit fields of
	// this policy's rules to responses: Always, or OnRefusal (429 responses only).
	// +kubebuilder:default=Always
	// +optional
	RateLimitHeaders HeadersMode `json:"rateLimitHeaders,omitempty"`

	// rules are checked in order for every request; a request is refused when any matching
	// rule in Enforce mode refuses it. Rule names are unique within a policy.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(r, self.exists_one(o, o.name == r.name))",message="rule names must be unique within a policy"
	// +listType=atomic
	// +required
	Rules []Rule `json:"rules"`
}

// Rule is one limit: which requests it counts, how it keys them and how much it admits.
// +kubebuilder:validation:XValidation:rule="!(has(self.refused) && self.refused == 'Counted' && has(self.cost) && has(self.cost.from) && self.cost.from == 'Response')",message="refused: Counted cannot go with cost.from: Response: a refused request's hold always goes back, since it costs nothing; leave refused unset"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.burst) || self.algorithm == 'TokenBucket'",message="limit.burst is only valid with algorithm TokenBucket"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'SlidingWindowLog' || !has(self.limit.requests) || self.limit.requests <= 10000",message="limit.requests must be at most 10000 with algorithm SlidingWindowLog, which stores every request of the window in Redis (about 130 bytes each); use SlidingWindowCounter for larger limits"
// +kubebuilder:validation:XValidation:rule="!has(self.candidate) || !has(self.candidate.limit.burst) || (has(self.candidate.algorithm) ? self.candidate.algorithm : (has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter')) == 'TokenBucket'",message="candidate.limit.burst is only valid when the candidate's algorithm (candidate.algorithm, or the rule's) is TokenBucket"
// +kubebuilder:validation:XValidation:rule="!has(self.candidate) || (has(self.candidate.algorithm) ? self.candidate.algorithm : (has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter')) != 'SlidingWindowLog' || self.candidate.limit.requests <= 10000",message="candidate.limit.requests must be at most 10000 when the candidate's algorithm (candidate.algorithm, or the rule's) is SlidingWindowLog"
// +kubebuilder:validation:XValidation:rule="!(has(self.cost) && has(self.cost.from) && self.cost.from == 'Response') || !has(self.candidate)",message="cost.from: Response cannot have a candidate (not supported yet): a candidate counts one unit per request, not the response's cost; remove the candidate, or try the budget as a rule of its own with mode: Shadow"
// +kubebuilder:validation:XValidation:rule="!(has(self.cost) && has(self.cost.from) && self.cost.from == 'Response') || !has(self.cost.defaultHold) || self.cost.defaultHold <= (((has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter') == 'TokenBucket' && has(self.limit.burst)) ? self.limit.burst : (has(self.limit.requests) ? self.limit.requests : 0))",message="cost.defaultHold must be at most the limit's capacity (limit.requests, or limit.burst of a TokenBucket): a larger hold could never be granted"
// +kubebuilder:validation:XValidation:rule="!(has(self.cost) && has(self.cost.from) && self.cost.from == 'Response') || !has(self.cost.minOutput) || self.cost.minOutput <= (((has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter') == 'TokenBucket' && has(self.limit.burst)) ? self.limit.burst : (has(self.limit.requests) ? self.limit.requests : 0))",message="cost.minOutput must be at most the limit's capacity (limit.requests, or limit.burst of a TokenBucket): no request could be let through"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.inFlight) || !has(self.cost)",message="limit.inFlight cannot go with cost: an in-flight rule counts requests in progress, not what they cost; put the budget in a rule of its own"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.inFlight) || !has(self.candidate)",message="limit.inFlight cannot have a candidate (not supported yet); try the new limit as a rule of its own with mode: Shadow"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.inFlight) || !has(self.refused)",message="limit.inFlight cannot go with refused: a slot always goes back when its request is refused or ends; leave refused unset"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.inFlight) || !has(self.durability) || !has(self.durability.mode) || self.durability.mode == 'None'",message="limit.inFlight cannot go with durability: a slot lives seconds and is re-asserted after a failover; leave durability unset"
// +kubebuilder:validation:XValidation:rule="!has(self.candidate) || !has(self.candidate.limit.inFlight)",message="candidate.limit.inFlight is not supported: a candidate is a limit per window (requests and window)"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.window) || !self.limit.window.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || duration(self.limit.window) <= duration('24h') || (has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter') == 'SlidingWindowCounter'",message="limit.window longer than 24h needs algorithm SlidingWindowCounter (a rolling window); for calendar days, weeks or months use limit.calendar with FixedWindow"
// +kubebuilder:validation:XValidation:rule="!has(self.limit.calendar) || (has(self.algorithm) && self.algorithm == 'FixedWindow')",message="limit.calendar needs algorithm FixedWindow: a calendar period is a fixed window that resets at its start"
// +kubebuilder:validation:XValidation:rule="!has(self.candidate) || !has(self.candidate.limit.calendar) || (has(self.candidate.algorithm) ? self.candidate.algorithm : (has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter')) == 'FixedWindow'",message="candidate.limit.calendar needs algorithm FixedWindow (candidate.algorithm, or the rule's): a calendar period is a fixed window that resets at its start"
// +kubebuilder:validation:XValidation:rule="!has(self.candidate) || !has(self.candidate.limit.window) || !self.candidate.limit.window.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$') || duration(self.candidate.limit.window) <= duration('24h') || (has(self.candidate.algorithm) ? self.candidate.algorithm : (has(self.algorithm) ? self.algorithm : 'SlidingWindowCounter')) == 'SlidingWindowCounter'",message="candidate.limit.window longer than 24h needs algorithm SlidingWindowCounter (candidate.algorithm, or the rule's); for calendar days, weeks or months use candidate.limit.calendar with FixedWindow"
type Rule struct {
	// name identifies the rule in the policy, in metrics, in Redis keys and in refusals.
	// A lowercase DNS label.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`

	// match restricts the rule to some requests. Without it the rule counts every request.
	// +optional
	Match *RuleMatch `json:"match,omitempty"`

	// key lists the request parts that together name the counter, e.g. [{header: X-API-Key}]
	// for one counter per API key, or [{constant: all}] for one counter shared by everyone.
	// User-supplied values are hashed before they reach Redis.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +required
	Key []KeyPart `json:"key"`

	// algorithm is the counting algorithm.
	// +kubebuilder:default=SlidingWindowCounter
	// +optional
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// limit is how many requests the rule admits per window (requests and window), or how
	// many may be in progress at once (inFlight).
	// +required
	Limit Limit `json:"limit"`

	// mode is Enforce (refuse over the limit) or Shadow (count and report, always admit).
	// +kubebuilder:default=Enforce
	// +optional
	Mode Mode `json:"mode,omitempty"`

	// candidate is a second limit counted beside limit on the same requests, that never
	// refuses: status.rules[].candidate says what it would have refused.
	// +optional
	Candidate *CandidateLimit `json:"candidate,omitempty"`

	// cost says what a request takes from the limit: one unit (from: Request, the default,
	// as without cost) or what its response reports (from: Response), such as an AI API's
	// tokens, held before the request is forwarded and settled after it.
	// +optional
	Cost *Cost `json:"cost,omitempty"`

	// topKeys says what sidecars report of the keys this rule refuses, in status.rules[]:
	// Hashes (when not set) or Values (their readable parts too).
	// +optional
	TopKeys TopKeysReport `json:"topKeys,omitempty"`

	// refused says whether the rule counts a request that another rule it matches refuses:
	// Uncounted (when not set: the request counts in no rule) or Counted (it counts here).
	// +optional
	Refused RefusedRequests `json:"refused,omitempty"`

	// durability says what the rule's grants wait for: a replica's or the append-only file's
	// acknowledgement, or nothing (when not set).
	// +optional
	Durability *Durability `json:"durability,omitempty"`
}

// PathMatchType says how match.path.value is compared with the request path: Gateway API's
// HTTPPathMatch types.
// +kubebuilder:validation:Enum=PathPrefix;Exact
type PathMatchType string

// The path match types.
const (
	// PathMatchPathPrefix matches by path element, case-sensitively: the value /abc matches
	// /abc, /abc/ and /abc/def, never /abcd. A trailing / in the value is ignored; / matches
	// every path.
	PathMatchPathPrefix PathMatchType = "PathPrefix"
	// PathMatchExact matches one path, case-sensitively: /abc matches /abc, not /abc/ or /Abc.
	PathMatchExact PathMatchType = "Exact"
)

// TrailingSlash says whether an Exact path match also matches the path with one / appended.
// +kubebuilder:validation:Enum=Strict;Ignore
type TrailingSlash string

// The trailing slash modes.
const (
	// TrailingSlashStrict matches the path as written: /abc matches /abc, not /abc/.
	TrailingSlashStrict TrailingSlash = "Strict"
	// TrailingSlashIgnore matches the path with or without one trailing /: /abc matches /abc
	// and /abc/, as routers that are not strict about a trailing slash (Express, ASP.NET
	// Core) route them.
	TrailingSlashIgnore TrailingSlash = "Ignore"
)

// MaxPathLength bounds match.path.value and match.pathPrefix, as Gateway API bounds
// HTTPPathMatch's value.
const MaxPathLength = 1024

// PathMatch matches the request path the way Gateway API's HTTPPathMatch does. The value is
// compared with the path after the sidecar normalised it (dot segments removed, slashes
// merged, escapes decoded; a path with an encoded slash is refused before any rule), so a
// request cannot dodge a rule by spelling its path differently.
// +kubebuilder:validation:XValidation:rule="self.value.startsWith('/')",message="match.path.value must be an absolute path starting with '/', such as /api"
// +kubebuilder:validation:XValidation:rule="!self.value.contains('//')",message="match.path.value must not contain '//': request paths are matched with runs of slashes merged into one"
// +kubebuilder:validation:XValidation:rule="!self.value.contains('/./') && !self.value.endsWith('/.')",message="match.path.value must not contain a '.' segment ('/./' or a trailing '/.'): request paths are matched with dot segments removed"
// +kubebuilder:validation:XValidation:rule="!self.value.contains('/../') && !self.value.endsWith('/..')",message="match.path.value must not contain a '..' segment ('/../' or a trailing '/..'): request paths are matched with dot segments removed"
// +kubebuilder:validation:XValidation:rule="!self.value.contains('%2f') && !self.value.contains('%2F')",message="match.path.value must not contain an encoded slash ('%2f' or '%2F'): the sidecar refuses such requests, so the rule could never match"
// +kubebuilder:validation:XValidation:rule="!self.value.contains('#')",message="match.path.value must not contain '#': a fragment is never part of a request path"
// +kubebuilder:validation:XValidation:rule="self.value.matches('^(?:[-A-Za-z0-9/._~!$&\\'()*+,;=:@]|%[0-9a-fA-F]{2})+$')",message="match.path.value may contain only letters, digits, /, the characters -._~!$&'()*+,;=:@ and percent-escapes of two hex digits (write a space as %20)"
// +kubebuilder:validation:XValidation:rule="!has(self.trailingSlash) || self.trailingSlash == 'Strict' || (has(self.type) && self.type == 'Exact')",message="match.path.trailingSlash: Ignore needs type: Exact (a PathPrefix match always ignores a trailing slash)"
type PathMatch struct {
	// type is PathPrefix (the default: match by path element, a trailing / ignored) or Exact
	// (the whole path).
	// +kubebuilder:default=PathPrefix
	// +optional
	Type PathMatchType `json:"type,omitempty"`

	// value is the path or path prefix, starting with /. Case-sensitive unless ignoreCase;
	// percent-escapes are decoded before comparison.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Value string `json:"value"`

	// ignoreCase compares the path case-insensitively: /login also matches /Login and /LOGIN.
	// Set it when the application's router matches paths case-insensitively (Express and
	// ASP.NET Core by default), or requests spelled in another case reach the route
	// uncounted. Like Envoy's ignore_case.
	// +optional
	IgnoreCase bool `json:"ignoreCase,omitempty"`

	// trailingSlash, for type Exact, is Strict (when not set: /login matches /login only) or
	// Ignore (/login also matches /login/). Set Ignore when the application's router is not
	// strict about a trailing slash (Express and ASP.NET Core by default).
	// +optional
	TrailingSlash TrailingSlash `json:"trailingSlash,omitempty"`
}

// RuleMatch selects requests. Every field given must match.
// +kubebuilder:validation:XValidation:rule="!(has(self.path) && has(self.pathPrefix))",message="match.path and match.pathPrefix are mutually exclusive: keep match.path (pathPrefix is deprecated)"
type RuleMatch struct {
	// path matches the request path, by path element (type PathPrefix, the default) or
	// exactly (type Exact), as Gateway API's HTTPPathMatch does.
	// +optional
	Path *PathMatch `json:"path,omitempty"`

	// pathPrefix is deprecated: write path: {type: PathPrefix, value: ...}, which it now
	// behaves as. It matches by path element: /login matches /login and /login/x but not
	// /login-help (an earlier version matched any path starting with these characters).
	// Mutually exclusive with path.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="match.pathPrefix must start with '/'"
	// +optional
	PathPrefix string `json:"pathPrefix,omitempty"`

	// methods matches requests with any of these HTTP methods, compared case-insensitively.
	// GET also matches HEAD, which routers serve with the GET handler.
	// +kubebuilder:validation:MaxItems=9
	// +listType=set
	// +optional
	Methods []HTTPMethod `json:"methods,omitempty"`

	// headers matches requests carrying every one of these headers.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	Headers []HeaderMatch `json:"headers,omitempty"`
}

// HeaderMatch matches a request header by name and, optionally, exact value.
type HeaderMatch struct {
	// name is the header name, case-insensitive.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	// +required
	Name string `json:"name"`

	// value, when set, must equal the header's value. Without it the header only has to be present.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Value *string `json:"value,omitempty"`
}

// KeyPart is one part of a rate limit key: exactly one of header, attribute or constant.
// +kubebuilder:validation:XValidation:rule="(has(self.header) ? 1 : 0) + (has(self.attribute) ? 1 : 0) + (has(self.constant) ? 1 : 0) == 1",message="a key part sets exactly one of header, attribute or constant"
type KeyPart struct {
	// header takes the value of this request header. A request without it is keyed by an
	// empty value, so all such requests share one counter.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	// +optional
	Header string `json:"header,omitempty"`

	// attribute takes a request attribute: RemoteAddress, ForwardedFor, Path or Method.
	// +optional
	Attribute Attribute `json:"attribute,omitempty"`

	// constant is a fixed value, for a counter every request shares.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Constant string `json:"constant,omitempty"`
}

// ScriptStatus records the Redis script an algorithm runs.
type ScriptStatus struct {
	// algorithm the script implements.
	// +required
	Algorithm Algorithm `json:"algorithm"`
	// sha is the SHA1 under which Redis stores the script (the EVALSHA argument).
	// +required
	SHA string `json:"sha"`
}

// RateLimitPolicyStatus is what the controller observed about a policy.
type RateLimitPolicyStatus struct {
	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Accepted, Programmed, Enforced, RedisConnectionBudget, TenantIsolation,
	// RedisMemoryPolicy and RedisDurability.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// configHash is the content hash of the namespace's compiled configuration that holds
	// this policy.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`

	// scripts are the Redis scripts this policy's rules run.
	// +listType=map
	// +listMapKey=algorithm
	// +optional
	Scripts []ScriptStatus `json:"scripts,omitempty"`

	// refused is the share of the policy's decisions its rules refused over the sidecars' last
	// reported interval, across the replicas, such as "2.5%".
	// +optional
	Refused string `json:"refused,omitempty"`

	// inFlight is how full the busiest key of the policy's in-flight rules is, as the live
	// replicas last reported: its slots held over its limit, such as "87.5%".
	// +optional
	InFlight string `json:"inFlight,omitempty"`

	// quota is how much of its current period's quota the heaviest user of the policy's long
	// windows (calendar periods, windows over 24h) used, such as "81.2%".
	// +optional
	Quota string `json:"quota,omitempty"`

	// rules is what the sidecars counted of each rule over their last reported interval: who
	// was refused, and what a candidate limit would have refused.
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	Rules []RuleStatus `json:"rules,omitempty"`
}

// RateLimitPolicy limits requests to the pods it targets, across all their replicas, with
// counters shared in Redis.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rlp,categories=redline
// +kubebuilder:printcolumn:name="Requests",type=integer,JSONPath=`.spec.rules[0].limit.requests`,description="Requests per window of the first rule"
// +kubebuilder:printcolumn:name="Window",type=string,JSONPath=`.spec.rules[0].limit.window`,description="Window of the first rule"
// +kubebuilder:printcolumn:name="Algorithm",type=string,JSONPath=`.spec.rules[0].algorithm`,description="Algorithm of the first rule"
// +kubebuilder:printcolumn:name="Programmed",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].status`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].status`
// +kubebuilder:printcolumn:name="Refused",type=string,JSONPath=`.status.refused`,description="Share of decisions refused over the sidecars' last interval"
// +kubebuilder:printcolumn:name="InFlight",type=string,JSONPath=`.status.inFlight`,description="Slots the busiest key of an in-flight rule holds, over its limit",priority=1
// +kubebuilder:printcolumn:name="Quota",type=string,JSONPath=`.status.quota`,description="Share of the current period's quota the heaviest user of a long window used",priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RateLimitPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired limiting.
	// +required
	Spec RateLimitPolicySpec `json:"spec"`

	// status is what the controller observed.
	// +optional
	Status RateLimitPolicyStatus `json:"status,omitempty"`
}

// RateLimitPolicyList is a list of RateLimitPolicy.
// +kubebuilder:object:root=true
type RateLimitPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RateLimitPolicy `json:"items"`
}
