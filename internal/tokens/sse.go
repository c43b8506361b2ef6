package tokens

import "bytes"

// MaxEventBytes bounds one server-sent event as the scanners hold it (its
// field lines, terminators left out). A longer event is skipped and counted;
// the events after it are read as usual.
const MaxEventBytes = 64 << 10

// sseParser splits an event stream (the HTML spec's text/event-stream) into
// events as bytes arrive, holding at most one event. No library is used: the
// one maintained Go SSE package on the approved list (gin-contrib/sse)
// decodes from an io.Reader to its end and keeps every event, where this
// needs bytes pushed in by Write calls and one event held at a time; the
// format is a dozen lines of line splitting.
type sseParser struct {
	line     []byte // the current line, up to the bound
	lineLen  int    // the current line's length, also past the bound
	data     []byte // the event's data lines joined by "\n"
	event    []byte // the event's type
	hasData  bool
	size     int  // bytes of the event so far
	overflow bool // the event passed MaxEventBytes: skip to its end
	afterCR  bool // the last byte was CR: an LF next ends no line
	skipped  int
	onEvent  func(typ, data []byte)
	onSkip   func(size int) // an event over the bound, of size bytes at least
}

func (p *sseParser) write(b []byte) {
	for len(b) > 0 {
		if p.afterCR {
			p.afterCR = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			p.appendLine(b)
			return
		}
		p.appendLine(b[:i])
		p.afterCR = b[i] == '\r'
		p.endLine()
		b = b[i+1:]
	}
}

func (p *sseParser) appendLine(b []byte) {
	p.lineLen += len(b)
	p.size += len(b)
	if p.size > MaxEventBytes {
		p.overflow = true
	}
	if !p.overflow {
		p.line = append(p.line, b...)
	}
}

func (p *sseParser) endLine() {
	defer func() { p.line, p.lineLen = p.line[:0], 0 }()
	if p.lineLen == 0 {
		p.dispatch()
		return
	}
	if p.overflow {
		return
	}
	name, value := p.line, []byte(nil)
	if i := bytes.IndexByte(p.line, ':'); i >= 0 {
		name, value = p.line[:i], p.line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		if p.hasData {
			p.data = append(p.data, '\n')
			p.size++
			if p.size > MaxEventBytes {
				p.overflow = true
				return
			}
		}
		p.data = append(p.data, value...)
		p.hasData = true
	case "event":
		p.event = append(p.event[:0], value...)
	}
}

func (p *sseParser) dispatch() {
	if p.overflow {
		p.skipped++
		if p.onSkip != nil {
			p.onSkip(p.size)
		}
	} else if p.hasData {
		p.onEvent(p.event, p.data)
	}
	p.data, p.event = p.data[:0], p.event[:0]
	p.hasData, p.overflow, p.size = false, false, 0
}
