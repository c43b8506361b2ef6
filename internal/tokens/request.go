package tokens

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
)

// Request is what a request body says about its cost.
type Request struct {
	Kind Kind
	// PromptTokens estimates the prompt's size in tokens, from above:
	// ceil(text bytes / 4) + 4 per message (or content, or input item) + 3,
	// where text bytes are the bytes of every JSON string value inside the
	// prompt fields (messages, system, tools, input, instructions,
	// contents, systemInstruction), escapes counted as written, and values
	// of keys that name rather than say (type, role, url, data, mime type,
	// ids) left out, plus each image at the most its API bills for one
	// (see OpenAIImageHigh and the others). Four bytes a token is the usual rate for English
	// text; escaped and non-Latin text is counted at its byte length,
	// which errs high for escapes and can err low for scripts whose
	// tokens are shorter than four bytes: the settle corrects either way.
	PromptTokens int64
	// OutputCap is the output cap the client set (the larger where it set
	// two), 0 when it set none, at most MaxTokens.
	OutputCap int64
	// Choices is how many outputs the cap applies to: OpenAI chat's and
	// completions' n (or best_of where larger, each prompt of a completions
	// list its own), Gemini's candidateCount; 1 when absent. The upstream
	// may spend OutputCap on each.
	Choices int64
	// Stream: the response is an event stream.
	Stream bool
	// IncludeUsage: an OpenAI chat stream asked for the usage chunk
	// (stream_options.include_usage). The other kinds always report usage.
	IncludeUsage bool
}

const (
	messages = "messages"
	tools    = "tools"
	input    = "input"
)

// promptFields are the top-level fields whose strings count toward the
// prompt, per kind.
var promptFields = map[Kind][]string{
	OpenAIChat:      {messages, tools, "functions"},
	OpenAIResponses: {input, "instructions", tools},
	Anthropic:       {messages, "system", tools},
	Gemini:          {"contents", "systemInstruction", "system_instruction", tools},
	// prompt (and input) may be token ids: each number is a token.
	OpenAICompletions: {"prompt", "suffix"},
	OpenAIEmbeddings:  {input},
}

// itemFields hold the lists whose items cost a per-message overhead.
var itemFields = map[Kind]string{
	OpenAIChat:        messages,
	OpenAIResponses:   "input",
	Anthropic:         messages,
	Gemini:            "contents",
	OpenAICompletions: "prompt",
	OpenAIEmbeddings:  input,
}

// ScanRequest sizes a request body of the given kind. stream says the route
// asks for a stream (Gemini's streamGenerateContent); for the other kinds the
// body's stream field decides. Keys are matched exactly, as the upstreams
// match them, so a client cannot show the scanner a cap the upstream ignores.
// Counts and flags are read as the upstreams read them (readNumber, readFlag):
// 1e5, 100000.0 and "100000" are a cap of 100000; -1 and 0 are no cap, as is
// an absent one. A body over MaxRequestBytes (ErrTooLarge), deeper than
// MaxDepth (ErrTooDeep), not JSON (ErrNotJSON), not of the kind's shape
// (ErrShape), or with a count or flag in a form not understood (ErrNumber) is
// an error: the request cannot be sized, and the caller refuses it or holds
// the rule's default, as the rule says.
func ScanRequest(body []byte, kind Kind, stream bool) (Request, error) {
	top, err := decodeTop(body, kind)
	if err != nil {
		return Request{}, err
	}
	r := Request{Kind: kind}
	var textBytes, items int64
	for _, f := range promptFields[kind] {
		textBytes += stringBytes(top[f])
	}
	list := top[itemFields[kind]]
	prompts := int64(1) // completions: one output per prompt of a list
	switch firstByte(list) {
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(list, &elems); err != nil {
			return Request{}, fmt.Errorf("%w: reading %s of a %s body: %v", ErrShape, itemFields[kind], kind, err)
		}
		items = int64(len(elems))
		if kind == OpenAICompletions || kind == OpenAIEmbeddings {
			// a list of token ids is one input; a list of strings or of id lists, one each
			textBytes += 4 * numbers(list)
			if len(elems) > 0 && firstByte(elems[0]) != '"' && firstByte(elems[0]) != '[' {
				items = 1
			}
			prompts = max(items, 1)
		}
	case '"':
		if kind != OpenAIResponses && kind != OpenAICompletions && kind != OpenAIEmbeddings {
			return Request{}, fmt.Errorf("%w: %s of a %s body is a string", ErrShape, itemFields[kind], kind)
		}
		items = 1
	default:
		return Request{}, fmt.Errorf("%w: %s body without a %s list", ErrShape, kind, itemFields[kind])
	}
	r.PromptTokens = clampAdd((textBytes+3)/4, 4*items+3)
	inputs, err := priceInputs(top, kind)
	if err != nil {
		return Request{}, err
	}
	r.PromptTokens = clampAdd(r.PromptTokens, inputs)

	caps, err := capFields(top, kind)
	if err != nil {
		return Request{}, err
	}
	noCap := false
	for _, c := range caps {
		n, none, err := readCap(c)
		if err != nil {
			return Request{}, fmt.Errorf("tokens: output cap of a %s body: %w", kind, err)
		}
		noCap = noCap || none
		r.OutputCap = max(r.OutputCap, n)
	}
	if noCap {
		// one field says no cap: an upstream that reads that field generates without one
		r.OutputCap = 0
	}

	if r.Choices, err = choices(top, kind); err != nil {
		return Request{}, err
	}
	if kind == OpenAICompletions {
		r.Choices = min(r.Choices, MaxTokens/prompts) * prompts
	}
	if err := readStream(top, kind, stream, &r); err != nil {
		return Request{}, err
	}
	return r, nil
}

// readStream reads whether the request streams (the route's say for Gemini, the body's for
// the others; embeddings never do) and whether an OpenAI stream asked for its usage.
func readStream(top map[string]json.RawMessage, kind Kind, stream bool, r *Request) error {
	switch kind {
	case Gemini:
		r.Stream = stream
	case OpenAIEmbeddings:
	default:
		s, err := readFlag(top["stream"])
		if err != nil {
			return fmt.Errorf("tokens: stream of a %s body: %w", kind, err)
		}
		r.Stream = s || stream
	}
	if (kind == OpenAIChat || kind == OpenAICompletions) && r.Stream {
		if so := top["stream_options"]; firstByte(so) == '{' {
			var opts map[string]json.RawMessage
			if err := json.Unmarshal(so, &opts); err != nil {
				return fmt.Errorf("%w: stream_options of a %s body: %v", ErrShape, kind, err)
			}
			usage, err := readFlag(opts["include_usage"])
			if err != nil {
				return fmt.Errorf("tokens: stream_options.include_usage: %w", err)
			}
			r.IncludeUsage = usage
		}
	}
	return nil
}

// MaxOutput is the most output the request can ask for: OutputCap on each
// of Choices, at most MaxTokens (0 when the client set no cap; 0 for
// embeddings, which have no output: see HasOutput).
func (r Request) MaxOutput() int64 {
	if r.OutputCap > 0 && r.Choices > MaxTokens/r.OutputCap {
		return MaxTokens
	}
	return r.OutputCap * r.Choices
}

// HasOutput is false for the kinds whose responses generate nothing
// (embeddings): their cost is the input, and they have no cap to write.
func (r Request) HasOutput() bool { return r.Kind != OpenAIEmbeddings }

// choices reads n (OpenAI chat and completions; best_of where the upstream
// generates that many and returns n) or candidateCount (Gemini).
func choices(top map[string]json.RawMessage, kind Kind) (int64, error) {
	var raw []json.RawMessage
	switch kind {
	case OpenAIChat, OpenAICompletions:
		raw = append(raw, top["n"], top["best_of"])
	case Gemini:
		gc, err := generationConfig(top)
		if err != nil {
			return 0, err
		}
		raw = append(raw, gc["candidateCount"], gc["candidate_count"])
	}
	c := int64(1)
	for _, v := range raw {
		n, _, err := readNumber(v)
		if err == nil && n < 0 {
			err = fmt.Errorf("%w: %d", ErrNumber, n)
		}
		if err != nil {
			return 0, fmt.Errorf("tokens: choice count of a %s body: %w", kind, err)
		}
		c = max(c, n)
	}
	return c, nil
}

// decodeTop checks the bounds and decodes the top-level object.
func decodeTop(body []byte, kind Kind) (map[string]json.RawMessage, error) {
	if len(body) > MaxRequestBytes {
		return nil, ErrTooLarge
	}
	if _, ok := promptFields[kind]; !ok {
		return nil, fmt.Errorf("%w: unknown API kind %d", ErrShape, kind)
	}
	if err := checkDepth(body); err != nil {
		return nil, err
	}
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: a %s body", ErrNotJSON, kind)
	}
	if firstByte(body) != '{' {
		return nil, fmt.Errorf("%w: %s body is not a JSON object", ErrShape, kind)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("%w: reading a %s body: %v", ErrNotJSON, kind, err)
	}
	return top, nil
}

// capFields returns the raw values of the output cap fields the body has.
func capFields(top map[string]json.RawMessage, kind Kind) ([]json.RawMessage, error) {
	var out []json.RawMessage
	add := func(m map[string]json.RawMessage, names ...string) {
		for _, n := range names {
			if v, ok := m[n]; ok {
				out = append(out, v)
			}
		}
	}
	switch kind {
	case OpenAIChat:
		// n_predict: llama.cpp reads it before max_tokens
		add(top, "max_tokens", "max_completion_tokens", "n_predict")
	case OpenAICompletions:
		add(top, "max_tokens", "n_predict")
	case OpenAIResponses:
		add(top, "max_output_tokens")
	case Anthropic:
		add(top, "max_tokens")
	case Gemini:
		gc, err := generationConfig(top)
		if err != nil {
			return nil, err
		}
		add(gc, "maxOutputTokens", "max_output_tokens")
	}
	return out, nil
}

// generationConfig decodes Gemini's generationConfig (either spelling: the
// upstream's JSON mapping accepts both); nil when absent.
func generationConfig(top map[string]json.RawMessage) (map[string]json.RawMessage, error) {
	var gc map[string]json.RawMessage
	for _, name := range []string{"generationConfig", "generation_config"} {
		raw, ok := top[name]
		if !ok || string(bytes.TrimSpace(raw)) == jsonNull {
			continue
		}
		if firstByte(raw) != '{' {
			return nil, fmt.Errorf("%w: %s is not an object", ErrShape, name)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("tokens: reading %s: %w", name, err)
		}
		if gc == nil {
			gc = m
			continue
		}
		maps.Copy(gc, m)
	}
	return gc, nil
}

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// skipKeys name values that are not prompt text.
var skipKeys = map[string]bool{
	"type": true, "role": true, "url": true, "data": true, "id": true,
	"mime_type": true, "mimeType": true, "media_type": true, "tool_call_id": true,
	"call_id": true, "file_id": true, "fileUri": true, "file_uri": true, "detail": true,
	"image_url": true, // responses: an image's URL or data, priced as an image (priceInputs)
}

// numbers counts the number literals in a valid JSON value outside strings:
// the token ids of a prompt given as ids.
func numbers(v []byte) int64 {
	var n int64
	inString, escaped, inNumber := false, false, false
	for _, c := range v {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		isNum := c == '-' || '0' <= c && c <= '9'
		if isNum && !inNumber {
			n++
		}
		inNumber = isNum || inNumber && (c == '.' || c == 'e' || c == 'E' || c == '+')
		if c == '"' {
			inString = true
		}
	}
	return n
}

// stringBytes sums the lengths of the string values in a valid JSON value,
// keys and values of skipKeys left out.
func stringBytes(v []byte) int64 {
	return sumStrings(v, func(key []byte) bool { return !skipKeys[string(key)] })
}

// sumStrings sums the lengths of the string values in a valid JSON value whose
// last key before them counts says to count (keys themselves never count). One
// pass and a short lookahead after each string, no allocation.
func sumStrings(v []byte, counts func(key []byte) bool) int64 {
	var n int64
	var lastKey []byte
	for i := 0; i < len(v); i++ {
		if v[i] != '"' {
			continue
		}
		start := i + 1
		j := start
		for j < len(v) && v[j] != '"' {
			if v[j] == '\\' {
				j++
			}
			j++
		}
		end := min(j, len(v))
		k := j + 1
		for k < len(v) && (v[k] == ' ' || v[k] == '\t' || v[k] == '\r' || v[k] == '\n') {
			k++
		}
		if k < len(v) && v[k] == ':' {
			lastKey = v[start:end]
		} else if counts(lastKey) {
			n += int64(end - start)
		}
		i = j
	}
	return n
}
