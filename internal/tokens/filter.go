package tokens

import (
	"bytes"
	"encoding/json"
	"io"
)

// UsageChunkFilter is an io.Writer over an OpenAI chat event stream that
// removes the usage-only chunk (choices empty, usage set) the sidecar asked
// for on a client's behalf, and passes every other byte through unchanged.
// It holds at most one event: each event is written on when its closing
// blank line arrives; an event over MaxEventBytes is not a usage chunk and is
// passed on as it comes. Close writes out an unterminated last event.
type UsageChunkFilter struct {
	w       io.Writer
	held    []byte // raw bytes of the current event
	lineLen int    // length of the current line
	afterCR bool   // the last byte was CR
	// trailLF: the last byte was the CR that ended an event; an LF next
	// belongs to that event, to be passed on or dropped with it.
	trailLF lfFate
	passing bool // the current event is over the bound: pass it through
	removed int
}

type lfFate int

const (
	lfNone lfFate = iota
	lfPass
	lfDrop
)

// NewUsageChunkFilter returns a filter writing to w.
func NewUsageChunkFilter(w io.Writer) *UsageChunkFilter { return &UsageChunkFilter{w: w} }

// Removed counts the chunks removed.
func (f *UsageChunkFilter) Removed() int { return f.removed }

// Write passes p on, less any usage-only chunk; it returns len(p) unless the
// underlying writer fails.
func (f *UsageChunkFilter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if fate := f.trailLF; fate != lfNone {
			f.trailLF = lfNone
			if p[0] == '\n' {
				f.afterCR = false
				if fate == lfPass {
					if _, err := f.w.Write(p[:1]); err != nil {
						return 0, err
					}
				}
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		seg := p
		if i >= 0 {
			seg = p[:i+1]
		}
		if err := f.take(seg, i >= 0); err != nil {
			return 0, err
		}
		p = p[len(seg):]
	}
	return n, nil
}

// take handles a segment that ends a line (eol: its last byte is CR or LF)
// or is the middle of one.
func (f *UsageChunkFilter) take(seg []byte, eol bool) error {
	if eol && seg[0] == '\n' && f.afterCR && len(seg) == 1 {
		// the LF of a CRLF: part of the line that CR ended
		f.afterCR = false
		return f.hold(seg)
	}
	content := len(seg)
	if eol {
		content--
	}
	f.lineLen += content
	if err := f.hold(seg); err != nil {
		return err
	}
	if !eol {
		f.afterCR = false
		return nil
	}
	f.afterCR = seg[len(seg)-1] == '\r'
	blank := f.lineLen == 0
	f.lineLen = 0
	if blank {
		return f.endEvent()
	}
	return nil
}

func (f *UsageChunkFilter) hold(b []byte) error {
	if f.passing {
		_, err := f.w.Write(b)
		return err
	}
	if len(f.held)+len(b) <= MaxEventBytes {
		f.held = append(f.held, b...)
		return nil
	}
	// over the bound: what is held goes on, and the rest of the event
	// after it as it comes, never copied
	f.passing = true
	if _, err := f.w.Write(f.held); err != nil {
		return err
	}
	f.held = f.held[:0]
	_, err := f.w.Write(b)
	return err
}

func (f *UsageChunkFilter) endEvent() error {
	if f.passing {
		f.passing = false
		if f.afterCR {
			f.trailLF = lfPass
		}
		return nil
	}
	ev := f.held
	f.held = f.held[:0]
	if isUsageChunk(ev) {
		f.removed++
		if f.afterCR {
			f.trailLF = lfDrop
		}
		return nil
	}
	if f.afterCR {
		f.trailLF = lfPass
	}
	_, err := f.w.Write(ev)
	return err
}

// Close writes out a last event that had no closing blank line.
func (f *UsageChunkFilter) Close() error {
	if len(f.held) == 0 {
		return nil
	}
	_, err := f.w.Write(f.held)
	f.held = f.held[:0]
	return err
}

// isUsageChunk reports whether a raw event is an OpenAI chat chunk with no
// choices and a usage object.
func isUsageChunk(ev []byte) bool {
	if !mayHaveUsage(ev) {
		return false
	}
	var found bool
	var data []byte
	p := sseParser{onEvent: func(_, d []byte) { data, found = append(data[:0], d...), true }}
	p.write(ev)
	if !found {
		return false
	}
	var top map[string]json.RawMessage
	if firstByte(data) != '{' || json.Unmarshal(data, &top) != nil {
		return false
	}
	choices, ok := top["choices"]
	if !ok || string(bytes.Join(bytes.Fields(choices), nil)) != "[]" {
		return false
	}
	return object(top["usage"]) != nil
}
