package rls

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The gRPC face, after "gRPC over HTTP2" (grpc/grpc doc/PROTOCOL-HTTP2.md), for unary calls
// only: a POST of one length-prefixed message, answered by HTTP 200, one length-prefixed message
// and the grpc-status trailer, or by a Trailers-Only response (grpc-status in the headers, no
// body) on failure. Nothing is compressed: the server advertises no grpc-accept-encoding, so
// clients send identity.

// The methods served, as HTTP/2 :path.
const (
	ShouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	HealthCheckMethod     = "/grpc.health.v1.Health/Check"
)

// MaxMessageSize bounds a request message; a larger one is answered RESOURCE_EXHAUSTED.
const MaxMessageSize = 1 << 20

const (
	rlsService       = "envoy.service.ratelimit.v3.RateLimitService"
	contentTypeGRPC  = "application/grpc"
	contentTypeProto = "application/grpc+proto"
	// grpc.health.v1.HealthCheckRequest.service and HealthCheckResponse.status, and the
	// ServingStatus values (grpc-go's health/grpc_health_v1).
	fHealthService   protowire.Number = 1
	fHealthStatus    protowire.Number = 1
	healthServing                     = 1
	healthNotServing                  = 2
)

// grpcCode is a gRPC status code, as google.golang.org/grpc/codes numbers them.
type grpcCode uint32

const (
	codeCanceled          grpcCode = 1
	codeUnknown           grpcCode = 2
	codeInvalidArgument   grpcCode = 3
	codeDeadlineExceeded  grpcCode = 4
	codeNotFound          grpcCode = 5
	codeResourceExhausted grpcCode = 8
	codeUnimplemented     grpcCode = 12
	codeInternal          grpcCode = 13
	codeUnavailable       grpcCode = 14
)

// grpcError is a failed call's status.
type grpcError struct {
	code grpcCode
	msg  string
}

func (e *grpcError) Error() string {
	return "rpc error: code = " + strconv.Itoa(int(e.code)) + " desc = " + e.msg
}

func statusError(code grpcCode, msg string) error { return &grpcError{code: code, msg: msg} }

// ServeHTTP serves one gRPC call.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header()["Date"] = nil // gRPC servers send none; keep the answer small
	ct, ok := grpcContentType(r.Header.Get("Content-Type"))
	if r.Method != http.MethodPost {
		writeStatus(w, ct, http.StatusMethodNotAllowed, statusError(codeInternal, "gRPC calls are POST, not "+r.Method))
		return
	}
	if !ok {
		writeStatus(w, ct, http.StatusUnsupportedMediaType,
			statusError(codeInvalidArgument, "invalid gRPC request content-type "+strconv.Quote(r.Header.Get("Content-Type"))))
		return
	}
	var call func(ctx context.Context, msg, out []byte) ([]byte, error)
	switch r.URL.Path {
	case ShouldRateLimitMethod:
		call = s.shouldRateLimit
	case HealthCheckMethod:
		call = s.healthCheck
	default:
		writeStatus(w, ct, http.StatusOK, statusError(codeUnimplemented, "unknown method "+r.URL.Path))
		return
	}
	if enc := r.Header.Get("Grpc-Encoding"); enc != "" && enc != "identity" {
		w.Header().Set("Grpc-Accept-Encoding", "identity")
		writeStatus(w, ct, http.StatusOK, statusError(codeUnimplemented, "grpc-encoding "+strconv.Quote(enc)+" is not supported"))
		return
	}
	ctx := r.Context()
	if v := r.Header.Get("Grpc-Timeout"); v != "" {
		d, ok := parseTimeout(v)
		if !ok {
			writeStatus(w, ct, http.StatusBadRequest, statusError(codeInternal, "malformed grpc-timeout "+strconv.Quote(v)))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
		// A client that never sends its message does not hold the handler past its deadline.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
	}
	msg, err := readMessage(r.Body)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err() // do not decide what the caller no longer waits for
	}
	var out []byte
	if err == nil {
		out, err = call(ctx, msg, make([]byte, 5, 64))
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		writeStatus(w, ct, http.StatusOK, contextStatus(ctx, err))
		return
	}
	out[0] = 0 // not compressed
	binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
	h := w.Header()
	h.Set("Content-Type", ct)
	h["Content-Length"] = nil // a gRPC answer ends with its trailers, not a length
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(out); err != nil {
		return // the client is gone
	}
	h.Set(http.TrailerPrefix+"Grpc-Status", "0")
}

func (s *Server) shouldRateLimit(ctx context.Context, msg, out []byte) ([]byte, error) {
	var req Request
	if err := req.Unmarshal(msg); err != nil {
		code := codeInternal // as grpc-go answers a message it cannot unmarshal
		if errors.Is(err, ErrTooLarge) {
			code = codeResourceExhausted
		}
		return nil, statusError(code, "grpc: error unmarshalling request: "+err.Error())
	}
	resp, err := s.ShouldRateLimit(ctx, &req)
	if err != nil {
		return nil, err
	}
	return resp.Marshal(out), nil
}

// healthCheck answers grpc.health.v1.Health/Check for the server ("") and the rate limit
// service: SERVING once policies are loaded (ShouldRateLimit answers UNAVAILABLE before).
func (s *Server) healthCheck(_ context.Context, msg, out []byte) ([]byte, error) {
	var service string
	err := fields(msg, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == fHealthService && typ == protowire.BytesType {
			return consumeString(b, &service)
		}
		return -1, nil
	})
	if err != nil {
		return nil, statusError(codeInternal, "grpc: error unmarshalling request: "+err.Error())
	}
	if service != "" && service != rlsService {
		return nil, statusError(codeNotFound, "unknown service")
	}
	st := uint64(healthServing)
	if s.Store.Current() == nil {
		st = healthNotServing
	}
	return appendVarint(out, fHealthStatus, st), nil
}

// grpcContentType checks a request's content-type and returns the one to answer with.
func grpcContentType(ct string) (string, bool) {
	switch {
	case ct == contentTypeGRPC:
		return ct, true
	case !strings.HasPrefix(ct, contentTypeGRPC) || len(ct) == len(contentTypeGRPC):
		return contentTypeGRPC, false
	}
	sub, _, _ := strings.Cut(ct[len(contentTypeGRPC)+1:], ";")
	switch {
	case ct[len(contentTypeGRPC)] == ';':
		return contentTypeGRPC, true
	case ct[len(contentTypeGRPC)] == '+' && strings.TrimSpace(sub) == "proto":
		return contentTypeProto, true
	}
	return contentTypeGRPC, false
}

// parseTimeout parses grpc-timeout: at most 8 digits and a unit, H, M, S, m, u or n.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	t, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	if t > uint64(math.MaxInt64/unit) {
		return math.MaxInt64, true
	}
	return unit * time.Duration(t), true
}

// readMessage reads the one length-prefixed message of a unary call, which must end the
// request stream.
func readMessage(body io.Reader) ([]byte, error) {
	var prefix [5]byte
	if _, err := io.ReadFull(body, prefix[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, statusError(codeInternal, "received no request message")
		}
		return nil, readError(err)
	}
	switch prefix[0] {
	case 0:
	case 1:
		return nil, statusError(codeUnimplemented, "compressed message: no grpc-encoding is supported")
	default:
		return nil, statusError(codeInternal, "unexpected message flags "+strconv.Itoa(int(prefix[0])))
	}
	n := binary.BigEndian.Uint32(prefix[1:])
	if n > MaxMessageSize {
		return nil, statusError(codeResourceExhausted,
			"received message larger than max ("+strconv.FormatUint(uint64(n), 10)+" vs. "+strconv.Itoa(MaxMessageSize)+")")
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(body, msg); err != nil {
		return nil, readError(err)
	}
	var more [1]byte
	switch _, err := io.ReadFull(body, more[:]); {
	case err == nil:
		return nil, statusError(codeInternal, "received more than one request message for a unary call")
	case !errors.Is(err, io.EOF):
		return nil, readError(err)
	}
	return msg, nil
}

func readError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return statusError(codeInternal, "request stream ended inside a message")
	}
	return err
}

// contextStatus turns the errors of an ended call context into their statuses.
func contextStatus(ctx context.Context, err error) error {
	if _, ok := errors.AsType[*grpcError](err); ok {
		return err
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return statusError(codeDeadlineExceeded, "deadline exceeded")
	case ctx.Err() != nil:
		return statusError(codeCanceled, "canceled")
	}
	return statusError(codeUnknown, err.Error())
}

// writeStatus answers a failed call Trailers-Only: the status in the headers, no body.
func writeStatus(w http.ResponseWriter, ct string, httpStatus int, err error) {
	st, ok := errors.AsType[*grpcError](err)
	if !ok {
		st = &grpcError{code: codeUnknown, msg: err.Error()}
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Grpc-Status", strconv.Itoa(int(st.code)))
	if st.msg != "" {
		h.Set("Grpc-Message", encodeMessage(st.msg))
	}
	h["Content-Length"] = nil
	w.WriteHeader(httpStatus)
}

// encodeMessage percent-encodes grpc-message: every byte outside printable ASCII, and '%'.
func encodeMessage(m string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c >= ' ' && c <= '~' && c != '%' {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(m)+16), m[:i]...)
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	if b == nil {
		return m
	}
	return string(b)
}
