package proxy

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// gRPC clients read a call's outcome from grpc-status, not from the HTTP status: an HTTP 429
// reaches a grpc-go caller as UNAVAILABLE with "unexpected HTTP status code", and its retry
// policy retries it. The proxy's own answers to a gRPC request (Content-Type application/grpc,
// +proto, +json, ...) are therefore in the trailers-only form of the gRPC over HTTP/2
// protocol: HTTP 200, Content-Type application/grpc, grpc-status and grpc-message in the one
// header block, no body. net/http sends a handler that writes no body as a single HEADERS frame
// that ends the stream, which is that form.

// isGRPC reports whether r is a gRPC call.
func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// writeGRPCStatus answers a gRPC call with code and msg, trailers-only. The header fields
// already set on w (the RateLimit fields, Retry-After) go with it.
func writeGRPCStatus(w http.ResponseWriter, code codes.Code, msg string) {
	hdr := w.Header()
	delete(hdr, "Content-Length")
	hdr["Content-Type"] = []string{"application/grpc"}
	hdr["Grpc-Status"] = []string{strconv.Itoa(int(code))}
	// grpc-message is percent-encoded (gRPC over HTTP/2); PathEscape encodes a superset of
	// the bytes it must, and every gRPC client decodes any %XX.
	hdr["Grpc-Message"] = []string{url.PathEscape(msg)}
	w.WriteHeader(http.StatusOK)
}

// refuseFor answers a refused request: a 429 (refuse), or RESOURCE_EXHAUSTED to a gRPC call.
func refuseFor(w http.ResponseWriter, r *http.Request, d *decide.Decision) {
	if !isGRPC(r) {
		refuse(w, d)
		return
	}
	d.Fields().Write(w.Header())
	writeGRPCStatus(w, codes.ResourceExhausted, "rate limited by policy "+d.Refused.Rule.Policy.Name+
		" rule "+d.Refused.Rule.Name+"; retry after "+strconv.FormatInt(d.RetryAfterSeconds(), 10)+"s")
}

// refuseRepeatedFor answers a request that repeats a key header: 400, or INVALID_ARGUMENT.
func refuseRepeatedFor(w http.ResponseWriter, r *http.Request, err error) {
	if !isGRPC(r) {
		refuseRepeated(w, err)
		return
	}
	writeGRPCStatus(w, codes.InvalidArgument, "a rate limit key header is sent more than once: "+err.Error())
}

// refuseCostedGRPC answers a gRPC call that rule, which takes its cost from the response (a
// token budget), matches. Such a rule reads a model API's JSON bodies and usage; a gRPC call's are
// length-prefixed protobuf messages it cannot read, so it would be charged what the rule
// guesses, not what it cost. It is refused instead, naming the rule, so that the policy's
// author narrows the rule's match.
func (h *Handler) refuseCostedGRPC(w http.ResponseWriter, rule *ruleset.Rule) {
	if h.opts.OnUnsized != nil {
		h.opts.OnUnsized(rule, UnsizedGRPC)
	}
	writeGRPCStatus(w, codes.Unimplemented, "rule "+rule.Name+" of policy "+rule.Policy.Name+" takes its cost from the response, which the sidecar cannot read from a gRPC call: match the rule to the model API's HTTP paths only")
}

// UnsizedGRPC is the reason a gRPC call matched by a token budget rule is refused.
const UnsizedGRPC = "grpc_not_sized"

// grpcCodeFor is the gRPC code of an HTTP status the proxy answers itself.
func grpcCodeFor(status int) codes.Code {
	switch status {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return codes.Unavailable
	default:
		return codes.Internal
	}
}
