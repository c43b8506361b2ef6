package rls

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The messages of envoy.service.ratelimit.v3, reduced to the fields the service reads and
// writes, with a hand-written protobuf codec: the generated go-control-plane code would link
// grpc-go and the protobuf reflection runtime into the sidecar. Field numbers and enum values
// are those of go-control-plane envoy v1.40.0 (service/ratelimit/v3/rls.pb.go,
// extensions/common/ratelimit/v3/ratelimit.pb.go, config/core/v3/base.pb.go) and of
// google.protobuf.{UInt32Value,UInt64Value,Duration}; the tests check them against those types.

// Request is envoy.service.ratelimit.v3.RateLimitRequest.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// HitsAddend is the request's cost when a descriptor gives none; 0 means 1.
	HitsAddend uint32
}

// Descriptor is envoy.extensions.common.ratelimit.v3.RateLimitDescriptor, without its limit
// override, which the service ignores.
type Descriptor struct {
	Entries []Entry
	// HitsAddend is the google.protobuf.UInt64Value hits_addend, nil when absent.
	HitsAddend     *uint64
	IsNegativeHits bool
}

// Entry is one RateLimitDescriptor.Entry.
type Entry struct {
	Key   string
	Value string
}

// Code is RateLimitResponse.Code.
type Code int32

// RateLimitResponse.Code values.
const (
	CodeUnknown   Code = 0
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

// Unit is RateLimitResponse.RateLimit.Unit.
type Unit int32

// RateLimitResponse.RateLimit.Unit values (WEEK was added after YEAR, hence its number).
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

// Response is envoy.service.ratelimit.v3.RateLimitResponse.
type Response struct {
	OverallCode          Code
	Statuses             []DescriptorStatus
	ResponseHeadersToAdd []HeaderValue
}

// DescriptorStatus is RateLimitResponse.DescriptorStatus.
type DescriptorStatus struct {
	Code           Code
	CurrentLimit   *RateLimit
	LimitRemaining uint32
	// DurationUntilReset is the google.protobuf.Duration, nil when absent.
	DurationUntilReset *time.Duration
}

// RateLimit is RateLimitResponse.RateLimit.
type RateLimit struct {
	Name            string
	RequestsPerUnit uint32
	Unit            Unit
	// UnitMultiplier is the google.protobuf.UInt32Value, nil when absent.
	UnitMultiplier *uint32
}

// HeaderValue is envoy.config.core.v3.HeaderValue (key and value; raw_value is not used).
type HeaderValue struct {
	Key   string
	Value string
}

// Field numbers.
const (
	// RateLimitRequest
	fReqDomain      protowire.Number = 1
	fReqDescriptors protowire.Number = 2
	fReqHitsAddend  protowire.Number = 3
	// RateLimitDescriptor
	fDescEntries        protowire.Number = 1
	fDescLimit          protowire.Number = 2
	fDescHitsAddend     protowire.Number = 3
	fDescIsNegativeHits protowire.Number = 4
	// RateLimitDescriptor.Entry
	fEntryKey   protowire.Number = 1
	fEntryValue protowire.Number = 2
	// RateLimitDescriptor.RateLimitOverride
	fOverrideUnitMultiplier protowire.Number = 3
	// google.protobuf.UInt32Value, UInt64Value
	fWrapperValue protowire.Number = 1
	// RateLimitResponse
	fRespOverallCode protowire.Number = 1
	fRespStatuses    protowire.Number = 2
	fRespHeaders     protowire.Number = 3
	// RateLimitResponse.DescriptorStatus
	fStatusCode               protowire.Number = 1
	fStatusCurrentLimit       protowire.Number = 2
	fStatusLimitRemaining     protowire.Number = 3
	fStatusDurationUntilReset protowire.Number = 4
	// RateLimitResponse.RateLimit
	fLimitRequestsPerUnit protowire.Number = 1
	fLimitUnit            protowire.Number = 2
	fLimitName            protowire.Number = 3
	fLimitUnitMultiplier  protowire.Number = 4
	// google.protobuf.Duration
	fDurationSeconds protowire.Number = 1
	fDurationNanos   protowire.Number = 2
	// envoy.config.core.v3.HeaderValue
	fHeaderKey   protowire.Number = 1
	fHeaderValue protowire.Number = 2
)

// Bounds on a request beyond its size (MaxMessageSize): the decoded form of a message of
// empty entries would otherwise be 16 times its size.
const (
	MaxDescriptors = 1024
	MaxEntries     = 16384 // over all descriptors
)

var (
	errInvalidUTF8 = errors.New("string field contains invalid UTF-8")
	// ErrTooLarge is wrapped by the errors of a request over MaxDescriptors or MaxEntries.
	ErrTooLarge = errors.New("request too large")
)

// Unmarshal decodes a RateLimitRequest. It accepts and refuses what proto.Unmarshal does with
// the go-control-plane type (unknown fields of any wire type are skipped, a known field with
// another wire type is an unknown field, strings must be UTF-8, a repeated singular field's
// last value wins, a repeated message field merges), plus the bounds above.
func (r *Request) Unmarshal(b []byte) error {
	*r = Request{}
	entries := 0
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fReqDomain && typ == protowire.BytesType:
			return consumeString(b, &r.Domain)
		case num == fReqDescriptors && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			if len(r.Descriptors) == MaxDescriptors {
				return 0, fmt.Errorf("%w: more than %d descriptors", ErrTooLarge, MaxDescriptors)
			}
			r.Descriptors = append(r.Descriptors, Descriptor{})
			return n, r.Descriptors[len(r.Descriptors)-1].unmarshal(v, &entries)
		case num == fReqHitsAddend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			r.HitsAddend = uint32(v)
			return n, varintErr(n)
		}
		return -1, nil
	})
}

func (d *Descriptor) unmarshal(b []byte, entries *int) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ == protowire.BytesType && num <= fDescHitsAddend {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			switch num {
			case fDescEntries:
				if *entries == MaxEntries {
					return 0, fmt.Errorf("%w: more than %d descriptor entries", ErrTooLarge, MaxEntries)
				}
				*entries++
				d.Entries = append(d.Entries, Entry{})
				return n, d.Entries[len(d.Entries)-1].unmarshal(v)
			case fDescLimit:
				return n, validateOverride(v)
			default: // fDescHitsAddend; a repeated occurrence merges into the first
				if d.HitsAddend == nil {
					d.HitsAddend = new(uint64)
				}
				return n, unmarshalWrapper(v, d.HitsAddend)
			}
		}
		if num == fDescIsNegativeHits && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			d.IsNegativeHits = protowire.DecodeBool(v)
			return n, varintErr(n)
		}
		return -1, nil
	})
}

func (e *Entry) unmarshal(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fEntryKey && typ == protowire.BytesType:
			return consumeString(b, &e.Key)
		case num == fEntryValue && typ == protowire.BytesType:
			return consumeString(b, &e.Value)
		}
		return -1, nil
	})
}

// unmarshalWrapper decodes google.protobuf.UInt64Value into *v.
func unmarshalWrapper(b []byte, v *uint64) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == fWrapperValue && typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			*v = x
			return n, varintErr(n)
		}
		return -1, nil
	})
}

// validateOverride checks a RateLimitDescriptor.RateLimitOverride the way proto.Unmarshal
// would, without keeping it: its only message field is the UInt32Value unit_multiplier.
func validateOverride(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == fOverrideUnitMultiplier && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			var x uint64
			return n, unmarshalWrapper(v, &x)
		}
		return -1, nil
	})
}

// fields walks the fields of a message. field consumes one field's value from b and returns
// its length, or -1 to have it skipped as an unknown field.
func fields(b []byte, field func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num := tag >> 3; num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
			return fmt.Errorf("invalid field number %d", num)
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		n, err := field(num, typ, b)
		if err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
		if n < 0 {
			// Unknown, or a known field with another wire type (also unknown to proto.Unmarshal).
			// ConsumeFieldValue refuses a stray end-group and bounds group nesting.
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

func varintErr(n int) error {
	if n < 0 {
		return protowire.ParseError(n)
	}
	return nil
}

func consumeString(b []byte, s *string) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	if !utf8.Valid(v) {
		return 0, errInvalidUTF8
	}
	*s = string(v)
	return n, nil
}

// Marshal appends the encoding of the response to b, fields in number order as proto.Marshal
// writes them.
func (r *Response) Marshal(b []byte) []byte {
	b = appendVarint(b, fRespOverallCode, uint64(int64(r.OverallCode)))
	for i := range r.Statuses {
		s := &r.Statuses[i]
		b = protowire.AppendTag(b, fRespStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.size()))
		b = s.marshal(b)
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = protowire.AppendTag(b, fRespHeaders, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(h.size()))
		b = appendString(b, fHeaderKey, h.Key)
		b = appendString(b, fHeaderValue, h.Value)
	}
	return b
}

// Size is the length of the response's encoding.
func (r *Response) Size() int {
	n := sizeVarint(fRespOverallCode, uint64(int64(r.OverallCode)))
	for i := range r.Statuses {
		n += sizeMessage(fRespStatuses, r.Statuses[i].size())
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += sizeMessage(fRespHeaders, h.size())
	}
	return n
}

func (h HeaderValue) size() int {
	return sizeString(fHeaderKey, h.Key) + sizeString(fHeaderValue, h.Value)
}

func (s *DescriptorStatus) size() int {
	n := sizeVarint(fStatusCode, uint64(int64(s.Code))) + sizeVarint(fStatusLimitRemaining, uint64(s.LimitRemaining))
	if s.CurrentLimit != nil {
		n += sizeMessage(fStatusCurrentLimit, s.CurrentLimit.size())
	}
	if s.DurationUntilReset != nil {
		n += sizeMessage(fStatusDurationUntilReset, durationSize(*s.DurationUntilReset))
	}
	return n
}

func (s *DescriptorStatus) marshal(b []byte) []byte {
	b = appendVarint(b, fStatusCode, uint64(int64(s.Code)))
	if l := s.CurrentLimit; l != nil {
		b = protowire.AppendTag(b, fStatusCurrentLimit, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(l.size()))
		b = l.marshal(b)
	}
	b = appendVarint(b, fStatusLimitRemaining, uint64(s.LimitRemaining))
	if d := s.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, fStatusDurationUntilReset, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(durationSize(*d)))
		secs, nanos := durationParts(*d)
		b = appendVarint(b, fDurationSeconds, uint64(secs))
		b = appendVarint(b, fDurationNanos, uint64(int64(nanos)))
	}
	return b
}

func (l *RateLimit) size() int {
	n := sizeVarint(fLimitRequestsPerUnit, uint64(l.RequestsPerUnit)) + sizeVarint(fLimitUnit, uint64(int64(l.Unit))) +
		sizeString(fLimitName, l.Name)
	if l.UnitMultiplier != nil {
		n += sizeMessage(fLimitUnitMultiplier, sizeVarint(fWrapperValue, uint64(*l.UnitMultiplier)))
	}
	return n
}

func (l *RateLimit) marshal(b []byte) []byte {
	b = appendVarint(b, fLimitRequestsPerUnit, uint64(l.RequestsPerUnit))
	b = appendVarint(b, fLimitUnit, uint64(int64(l.Unit)))
	b = appendString(b, fLimitName, l.Name)
	if m := l.UnitMultiplier; m != nil {
		b = protowire.AppendTag(b, fLimitUnitMultiplier, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeVarint(fWrapperValue, uint64(*m))))
		b = appendVarint(b, fWrapperValue, uint64(*m))
	}
	return b
}

// durationParts splits d as durationpb.New does: seconds and nanoseconds of the same sign.
func durationParts(d time.Duration) (int64, int32) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	return secs, int32(nanos - secs*1e9)
}

func durationSize(d time.Duration) int {
	secs, nanos := durationParts(d)
	return sizeVarint(fDurationSeconds, uint64(secs)) + sizeVarint(fDurationNanos, uint64(int64(nanos)))
}

// Proto3 scalars are written only when not zero.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func sizeMessage(num protowire.Number, size int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(size)
}
