package rls_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/sidecar/rls"
)

// fromProto is what rls.Request.Unmarshal must read from the encoding of m.
func fromProto(m *rlsv3.RateLimitRequest) rls.Request {
	r := rls.Request{Domain: m.GetDomain(), HitsAddend: m.GetHitsAddend()}
	for _, d := range m.GetDescriptors() {
		x := rls.Descriptor{IsNegativeHits: d.GetIsNegativeHits()}
		if d.GetHitsAddend() != nil {
			x.HitsAddend = new(d.GetHitsAddend().GetValue())
		}
		for _, e := range d.GetEntries() {
			x.Entries = append(x.Entries, rls.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		r.Descriptors = append(r.Descriptors, x)
	}
	return r
}

// sameDecoding checks that rls.Request.Unmarshal and proto.Unmarshal into go-control-plane's
// RateLimitRequest agree on b: both refuse it, or both read the same fields. The one allowed
// difference is a request over rls's bounds, which proto.Unmarshal accepts.
func sameDecoding(b []byte) error {
	var want rlsv3.RateLimitRequest
	wantErr := proto.Unmarshal(b, &want)
	var got rls.Request
	err := got.Unmarshal(b)
	switch {
	case wantErr != nil && err != nil:
		return nil
	case errors.Is(err, rls.ErrTooLarge) && wantErr == nil:
		entries := 0
		for _, d := range want.GetDescriptors() {
			entries += len(d.GetEntries())
		}
		if len(want.GetDescriptors()) <= rls.MaxDescriptors && entries <= rls.MaxEntries {
			return fmt.Errorf("refused as too large with %d descriptors and %d entries: %v", len(want.GetDescriptors()), entries, err)
		}
		return nil
	case wantErr != nil:
		return fmt.Errorf("accepted what proto.Unmarshal refuses (%v): %+v", wantErr, got)
	case err != nil:
		return fmt.Errorf("refused what proto.Unmarshal accepts: %w", err)
	}
	exp := fromProto(&want)
	if !equalRequests(got, exp) {
		return fmt.Errorf("decoded\n%s\nwant\n%s", dump(got), dump(exp))
	}
	return nil
}

func equalRequests(a, b rls.Request) bool {
	if a.Domain != b.Domain || a.HitsAddend != b.HitsAddend || len(a.Descriptors) != len(b.Descriptors) {
		return false
	}
	for i := range a.Descriptors {
		x, y := &a.Descriptors[i], &b.Descriptors[i]
		if x.IsNegativeHits != y.IsNegativeHits || (x.HitsAddend == nil) != (y.HitsAddend == nil) ||
			(x.HitsAddend != nil && *x.HitsAddend != *y.HitsAddend) || len(x.Entries) != len(y.Entries) {
			return false
		}
		for j := range x.Entries {
			if x.Entries[j] != y.Entries[j] {
				return false
			}
		}
	}
	return true
}

func dump(r rls.Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain=%q hits=%d", r.Domain, r.HitsAddend)
	for _, d := range r.Descriptors {
		fmt.Fprintf(&b, "\n  neg=%v", d.IsNegativeHits)
		if d.HitsAddend != nil {
			fmt.Fprintf(&b, " hits=%d", *d.HitsAddend)
		}
		for _, e := range d.Entries {
			fmt.Fprintf(&b, " %q=%q", e.Key, e.Value)
		}
	}
	return b.String()
}

// unknownFields returns fields of numbers 20.. of every wire type, groups nested.
func unknownFields(rnd *rand.Rand) []byte {
	var b []byte
	for range rnd.IntN(4) {
		num := protowire.Number(20 + rnd.IntN(1000))
		switch rnd.IntN(5) {
		case 0:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, rnd.Uint64())
		case 1:
			b = protowire.AppendTag(b, num, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, rnd.Uint32())
		case 2:
			b = protowire.AppendTag(b, num, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, rnd.Uint64())
		case 3:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, []byte(randString(rnd)))
		case 4:
			b = protowire.AppendTag(b, num, protowire.StartGroupType)
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, 7)
			b = protowire.AppendTag(b, 2, protowire.StartGroupType)
			b = protowire.AppendTag(b, 2, protowire.EndGroupType)
			b = protowire.AppendTag(b, num, protowire.EndGroupType)
		}
	}
	return b
}

func randString(rnd *rand.Rand) string {
	switch rnd.IntN(10) {
	case 0, 1:
		return ""
	case 2:
		return "ünïcødé/✓"
	case 3:
		if rnd.IntN(10) == 0 {
			return strings.Repeat("v", 1+rnd.IntN(300_000)) // a large value: a length of 3 bytes
		}
	}
	return fmt.Sprint("s", rnd.Uint32())
}

// randRequest returns a random request, unknown fields included at every level.
func randRequest(rnd *rand.Rand) *rlsv3.RateLimitRequest {
	m := &rlsv3.RateLimitRequest{Domain: randString(rnd)}
	if rnd.IntN(2) == 0 {
		m.HitsAddend = rnd.Uint32() >> rnd.IntN(32)
	}
	for range rnd.IntN(6) {
		d := &rlv3.RateLimitDescriptor{IsNegativeHits: rnd.IntN(4) == 0}
		switch rnd.IntN(4) {
		case 0:
			d.HitsAddend = wrapperspb.UInt64(0) // present, zero
		case 1:
			d.HitsAddend = wrapperspb.UInt64(rnd.Uint64() >> rnd.IntN(64))
		}
		if rnd.IntN(4) == 0 {
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rnd.Uint32(), Unit: typev3.RateLimitUnit_MINUTE}
			if rnd.IntN(2) == 0 {
				d.Limit.UnitMultiplier = wrapperspb.UInt32(rnd.Uint32())
			}
		}
		for range rnd.IntN(5) {
			e := &rlv3.RateLimitDescriptor_Entry{Key: randString(rnd), Value: randString(rnd)}
			e.ProtoReflect().SetUnknown(unknownFields(rnd))
			d.Entries = append(d.Entries, e)
		}
		if d.HitsAddend != nil {
			d.HitsAddend.ProtoReflect().SetUnknown(unknownFields(rnd))
		}
		d.ProtoReflect().SetUnknown(unknownFields(rnd))
		m.Descriptors = append(m.Descriptors, d)
	}
	m.ProtoReflect().SetUnknown(unknownFields(rnd))
	return m
}

func TestRequestDecodingMatchesProto(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		m := randRequest(rnd)
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var got rls.Request
		if err := got.Unmarshal(b); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := fromProto(m); !equalRequests(got, want) {
			t.Fatalf("request %d: decoded\n%s\nwant\n%s", i, dump(got), dump(want))
		}
		// Truncated and corrupted, it is refused, or read as proto.Unmarshal reads it.
		if i%4 == 0 && len(b) < 4096 {
			for j := range len(b) {
				if err := sameDecoding(b[:j]); err != nil {
					t.Fatalf("request %d cut at %d of %d: %v", i, j, len(b), err)
				}
			}
		}
		corruptions := 20
		if len(b) > 1<<16 {
			corruptions = 2
		}
		for range corruptions {
			c := bytes.Clone(b)
			if len(c) > 0 {
				c[rnd.IntN(len(c))] = byte(rnd.Uint32())
			}
			if err := sameDecoding(c); err != nil {
				t.Fatalf("request %d corrupted: %v\n%x", i, err, c)
			}
		}
	}
}

// Encodings proto.Marshal does not write but proto.Unmarshal reads, and ones it refuses.
func TestRequestDecodingEdgeCases(t *testing.T) {
	tag := protowire.AppendTag
	msg := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(b, num, protowire.VarintType), v)
	}
	wrapper5 := varint(nil, 1, 5)
	entry := msg(msg(nil, 1, []byte("k")), 2, []byte("v"))
	cases := map[string][]byte{
		"empty":                                 {},
		"hits_addend twice, the last wins":      varint(varint(nil, 3, 4), 3, 9),
		"hits_addend over 32 bits is truncated": varint(nil, 3, 1<<40+3),
		"domain twice, the last wins":           msg(msg(nil, 1, []byte("a")), 1, []byte("b")),
		"wrapper twice merges":                  msg(nil, 2, msg(msg(nil, 3, wrapper5), 3, nil)),
		"wrapper value twice":                   msg(nil, 2, msg(nil, 3, varint(varint(nil, 1, 5), 1, 6))),
		"empty wrapper is present, zero":        msg(nil, 2, msg(nil, 3, nil)),
		"is_negative_hits 2 is true":            msg(nil, 2, varint(nil, 4, 2)),
		"domain as varint is unknown":           varint(nil, 1, 5),
		"descriptors as fixed32 are unknown":    protowire.AppendFixed32(tag(nil, 2, protowire.Fixed32Type), 1),
		"hits_addend as bytes is unknown":       msg(nil, 3, []byte("x")),
		"wrapper as varint is unknown":          msg(nil, 2, varint(nil, 3, 1)),
		"entry key as varint is unknown":        msg(nil, 2, msg(nil, 1, varint(nil, 1, 1))),
		"unknown group":                         tag(tag(varint(tag(nil, 99, protowire.StartGroupType), 1, 1), 99, protowire.EndGroupType), 1, protowire.VarintType),
		"empty entry, empty descriptor":         msg(msg(nil, 2, msg(nil, 1, nil)), 2, nil),
		"an entry":                              msg(nil, 2, msg(nil, 1, entry)),
		"invalid UTF-8 domain":                  msg(nil, 1, []byte{0xff}),
		"invalid UTF-8 entry value":             msg(nil, 2, msg(nil, 1, msg(nil, 2, []byte{'a', 0xc3}))),
		"invalid UTF-8 in an unknown field":     msg(nil, 50, []byte{0xff}),
		"mismatched end group":                  tag(tag(nil, 99, protowire.StartGroupType), 98, protowire.EndGroupType),
		"stray end group":                       tag(nil, 5, protowire.EndGroupType),
		"field number 0":                        varint(nil, 0, 1),
		"field number too large":                protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1),
		"wire type 6":                           protowire.AppendVarint(nil, 1<<3|6),
		"length past the end":                   append(tag(nil, 1, protowire.BytesType), 5, 'a'),
		"varint of 11 bytes":                    append(tag(nil, 3, protowire.VarintType), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01),
		"varint overflowing 64 bits":            append(tag(nil, 3, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02),
		"malformed limit override":              msg(nil, 2, msg(nil, 2, []byte{0x0a})),
		"malformed override multiplier":         msg(nil, 2, msg(nil, 2, msg(nil, 3, []byte{0x08}))),
		"override with unknown bytes":           msg(nil, 2, msg(nil, 2, msg(nil, 7, []byte{0xff}))),
		"malformed wrapper":                     msg(nil, 2, msg(nil, 3, []byte{0x08, 0x80})),
		"truncated tag":                         {0x80},
		"deep unknown groups": func() []byte {
			var b []byte
			for range 20000 {
				b = tag(b, 30, protowire.StartGroupType)
			}
			return b
		}(),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if err := sameDecoding(b); err != nil {
				t.Fatal(err)
			}
		})
	}
	var r rls.Request
	if err := r.Unmarshal(msg(nil, 2, msg(msg(nil, 3, wrapper5), 3, nil))); err != nil || r.Descriptors[0].HitsAddend == nil || *r.Descriptors[0].HitsAddend != 5 {
		t.Fatalf("a second, empty hits_addend must keep the first's value: %v", err)
	}
}

func TestRequestBounds(t *testing.T) {
	many := &rlsv3.RateLimitRequest{}
	for range rls.MaxDescriptors {
		many.Descriptors = append(many.Descriptors, &rlv3.RateLimitDescriptor{})
	}
	b, _ := proto.Marshal(many)
	var r rls.Request
	if err := r.Unmarshal(b); err != nil || len(r.Descriptors) != rls.MaxDescriptors {
		t.Fatalf("%d descriptors: %v", rls.MaxDescriptors, err)
	}
	many.Descriptors = append(many.Descriptors, &rlv3.RateLimitDescriptor{})
	b, _ = proto.Marshal(many)
	if err := r.Unmarshal(b); !errors.Is(err, rls.ErrTooLarge) {
		t.Fatalf("%d descriptors: %v", rls.MaxDescriptors+1, err)
	}
	entries := &rlsv3.RateLimitRequest{}
	for range 4 {
		d := &rlv3.RateLimitDescriptor{}
		for range rls.MaxEntries / 4 {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{})
		}
		entries.Descriptors = append(entries.Descriptors, d)
	}
	b, _ = proto.Marshal(entries)
	if err := r.Unmarshal(b); err != nil {
		t.Fatalf("%d entries: %v", rls.MaxEntries, err)
	}
	entries.Descriptors[3].Entries = append(entries.Descriptors[3].Entries, &rlv3.RateLimitDescriptor_Entry{})
	b, _ = proto.Marshal(entries)
	if err := r.Unmarshal(b); !errors.Is(err, rls.ErrTooLarge) {
		t.Fatalf("%d entries: %v", rls.MaxEntries+1, err)
	}
}

// toProto is what the encoding of r must read as.
func toProto(r *rls.Response) *rlsv3.RateLimitResponse {
	m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.OverallCode)}
	for _, s := range r.Statuses {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(s.Code), LimitRemaining: s.LimitRemaining}
		if l := s.CurrentLimit; l != nil {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)}
			if l.UnitMultiplier != nil {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(*l.UnitMultiplier)
			}
		}
		if s.DurationUntilReset != nil {
			st.DurationUntilReset = durationpb.New(*s.DurationUntilReset)
		}
		m.Statuses = append(m.Statuses, st)
	}
	for _, h := range r.ResponseHeadersToAdd {
		m.ResponseHeadersToAdd = append(m.ResponseHeadersToAdd, &corev3.HeaderValue{Key: h.Key, Value: h.Value})
	}
	return m
}

func randResponse(rnd *rand.Rand) *rls.Response {
	codes := []rls.Code{rls.CodeUnknown, rls.CodeOK, rls.CodeOverLimit}
	units := []rls.Unit{rls.UnitUnknown, rls.UnitSecond, rls.UnitMinute, rls.UnitHour, rls.UnitDay, rls.UnitMonth, rls.UnitYear, rls.UnitWeek}
	durations := []time.Duration{0, 1, time.Second, 1500 * time.Millisecond, 2 * time.Hour, -time.Second - 5, -3, math.MaxInt64, math.MinInt64}
	r := &rls.Response{OverallCode: codes[rnd.IntN(len(codes))]}
	for range rnd.IntN(5) {
		s := rls.DescriptorStatus{Code: codes[rnd.IntN(len(codes))]}
		if rnd.IntN(2) == 0 {
			s.LimitRemaining = rnd.Uint32() >> rnd.IntN(32)
		}
		if rnd.IntN(3) > 0 {
			s.CurrentLimit = &rls.RateLimit{Name: randString(rnd), RequestsPerUnit: rnd.Uint32() >> rnd.IntN(32), Unit: units[rnd.IntN(len(units))]}
			switch rnd.IntN(3) {
			case 0:
				s.CurrentLimit.UnitMultiplier = new(uint32(0))
			case 1:
				s.CurrentLimit.UnitMultiplier = new(rnd.Uint32() >> rnd.IntN(32))
			}
		}
		if rnd.IntN(3) > 0 {
			d := durations[rnd.IntN(len(durations))]
			if rnd.IntN(2) == 0 {
				d = time.Duration(rnd.Int64() >> rnd.IntN(64))
			}
			s.DurationUntilReset = &d
		}
		r.Statuses = append(r.Statuses, s)
	}
	for range rnd.IntN(4) {
		r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, rls.HeaderValue{Key: randString(rnd), Value: randString(rnd)})
	}
	return r
}

func TestResponseEncodingMatchesProto(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		r := randResponse(rnd)
		b := r.Marshal(nil)
		if len(b) != r.Size() {
			t.Fatalf("response %d: Size %d, encoding of %d bytes", i, r.Size(), len(b))
		}
		want := toProto(r)
		var got rlsv3.RateLimitResponse
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("response %d: proto.Unmarshal: %v", i, err)
		}
		if !proto.Equal(&got, want) {
			t.Fatalf("response %d: read back as\n%v\nwant\n%v", i, &got, want)
		}
		// The same bytes as proto.Marshal, too: fields in number order, zero scalars omitted.
		wb, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, wb) {
			t.Fatalf("response %d: encoded\n%x\nproto.Marshal writes\n%x", i, b, wb)
		}
		// Marshal appends.
		if p := r.Marshal([]byte("prefix")); string(p[:6]) != "prefix" || !bytes.Equal(p[6:], b) {
			t.Fatalf("response %d: Marshal does not append", i)
		}
	}
}

func FuzzRequestUnmarshal(f *testing.F) {
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 30 {
		m := randRequest(rnd)
		for _, d := range m.Descriptors {
			for _, e := range d.Entries {
				e.Key, e.Value = e.Key[:min(len(e.Key), 40)], e.Value[:min(len(e.Value), 40)]
			}
		}
		m.Domain = m.Domain[:min(len(m.Domain), 40)]
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x02, 0x1a, 0x00, 0x12, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := sameDecoding(b); err != nil {
			t.Fatal(err)
		}
	})
}
