package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrNotPriced is returned for a body with an input whose cost the request
// does not show: a file, a document, audio or video, or context the upstream
// keeps (a previous response, a conversation, a cached content). The caller
// refuses it or holds the rule's default, as the rule says.
var ErrNotPriced = errors.New("tokens: an input the token estimate cannot price")

// The most an image costs in each API, by the provider's documented pricing;
// an image of unknown size is held at it. The settle charges what the upstream
// reports.
const (
	// OpenAI (chat image_url, responses input_image, computer_screenshot):
	// detail low is 85; high or auto at most 85 + 170 per 512 px tile, and a
	// gpt-4o-class image has at most 8 tiles (fit in 2048 px, short side 768).
	OpenAIImageLow  int64 = 85
	OpenAIImageHigh int64 = 85 + 170*8
	// Anthropic image blocks: width x height / 750, images over about 1.15
	// megapixels scaled down first: about 1,600 at most.
	AnthropicImage int64 = 1600
	// Gemini inline or file data of an image type: 258 per 768 px tile;
	// held at 9 tiles (an image up to 2304 px a side, and more than a
	// Gemini 3 image at high media resolution).
	GeminiImage int64 = 258 * 9
)

// media is what scanMedia found in a body's prompt: the tokens its images are
// priced at, or the first input that cannot be priced.
type media struct {
	tokens   int64
	unpriced string // what the first input that cannot be priced is, "" when none
}

// mediaFields are the top-level fields scanned for non-text inputs, per kind
// (tool definitions are left out: a schema's "type" names no input).
var mediaFields = map[Kind][]string{
	OpenAIChat:      {messages},
	OpenAIResponses: {input, "instructions"},
	Anthropic:       {messages, "system"},
	Gemini:          {"contents", "systemInstruction", "system_instruction"},
}

// contextFields are top-level fields naming context the upstream keeps and
// bills as input: their size is not in the request.
var contextFields = map[Kind][]string{
	OpenAIResponses: {"previous_response_id", "conversation", "prompt"},
	Gemini:          {"cachedContent", "cached_content"},
}

// frame is one open object or array of the media scan.
type frame struct {
	object    bool
	key       []byte // the object's last key
	parentKey []byte // the key the object is the value of, in its parent
	typ       []byte // its "type" string
	detail    []byte // its "detail" string, or its image_url's
	mime      []byte // its mimeType string
}

// priceInputs prices the non-text inputs of a body's prompt (its tokens are
// added to the estimate) and refuses those that cannot be priced, with
// ErrNotPriced. top is the decoded top level of a valid JSON body nested no
// deeper than MaxDepth.
func priceInputs(top map[string]json.RawMessage, kind Kind) (int64, error) {
	for _, f := range contextFields[kind] {
		if v, ok := top[f]; ok && string(bytes.TrimSpace(v)) != jsonNull {
			return 0, fmt.Errorf("%w: %s of a %s body names context the upstream keeps", ErrNotPriced, f, kind)
		}
	}
	m := scanMedia(top, kind)
	if m.unpriced != "" {
		return 0, fmt.Errorf("%w: %s in a %s body", ErrNotPriced, m.unpriced, kind)
	}
	return m.tokens, nil
}

// scanMedia prices the non-text inputs of the prompt fields: one pass over
// their bytes, allocating the stack (at most MaxDepth frames) and a copy of
// each escaped key or type.
func scanMedia(top map[string]json.RawMessage, kind Kind) media {
	var m media
	stack := make([]frame, 0, MaxDepth+2)
	for _, name := range mediaFields[kind] {
		v := top[name]
		stack = stack[:0]
		for i := 0; i < len(v) && m.unpriced == ""; i++ {
			switch c := v[i]; c {
			case '{', '[':
				f := frame{object: c == '{'}
				if n := len(stack); n > 0 && stack[n-1].object {
					f.parentKey = stack[n-1].key
				}
				stack = append(stack, f)
			case '}', ']':
				n := len(stack)
				if n == 0 {
					continue
				}
				f := stack[n-1]
				stack = stack[:n-1]
				if !f.object {
					continue
				}
				var parent *frame
				if n > 1 {
					parent = &stack[n-2]
				}
				m.classify(&f, parent, kind)
			case '"':
				start := i + 1
				j := start
				for j < len(v) && v[j] != '"' {
					if v[j] == '\\' {
						j++
					}
					j++
				}
				end := min(j, len(v))
				i = j
				k := j + 1
				for k < len(v) && (v[k] == ' ' || v[k] == '\t' || v[k] == '\r' || v[k] == '\n') {
					k++
				}
				n := len(stack)
				if n == 0 || !stack[n-1].object {
					continue
				}
				f := &stack[n-1]
				if k < len(v) && v[k] == ':' {
					f.key = unquote(v, start, end)
					continue
				}
				switch string(f.key) {
				case "type":
					f.typ = unquote(v, start, end)
				case "detail":
					f.detail = unquote(v, start, end)
				case "mimeType", "mime_type":
					f.mime = unquote(v, start, end)
				}
			}
		}
	}
	return m
}

// classify prices a closed object f of the prompt (parent is the object or
// array it is in, nil at the top).
func (m *media) classify(f, parent *frame, kind Kind) {
	if m.unpriced != "" {
		return
	}
	switch kind {
	case OpenAIChat, OpenAIResponses:
		if string(f.parentKey) == "image_url" && parent != nil && f.detail != nil {
			parent.detail = f.detail // chat: {"type":"image_url","image_url":{"detail":...}}
		}
		switch string(f.typ) {
		// image and image_pil: vLLM's chat parts of an image
		case "image_url", "input_image", "computer_screenshot", "image", "image_pil":
			if string(f.detail) == "low" {
				m.add(OpenAIImageLow)
			} else {
				m.add(OpenAIImageHigh)
			}
		// audio_url, video_url, image_embeds and the rest: vLLM's other media parts
		case "input_audio", "file", "input_file", "item_reference",
			"audio_url", "video_url", "audio", "video", "image_embeds":
			m.unpriced = fmt.Sprintf("a %q part", f.typ)
		}
	case Anthropic:
		switch string(f.typ) {
		case "image":
			m.add(AnthropicImage)
		case "document", "container_upload":
			m.unpriced = fmt.Sprintf("a %q block", f.typ)
		}
	case Gemini:
		switch string(f.parentKey) {
		case "inlineData", "inline_data", "fileData", "file_data":
			if bytes.HasPrefix(f.mime, []byte("image/")) {
				m.add(GeminiImage)
			} else {
				m.unpriced = fmt.Sprintf("%s of type %q", f.parentKey, f.mime)
			}
		}
	}
}

func (m *media) add(n int64) { m.tokens = min(m.tokens+n, MaxTokens) }

// unquote is the string v[start:end] as the upstream reads it: escapes
// ("typ\u0065") decoded, so that a part is seen under any spelling. Only a
// string with an escape is copied; each string is read once, so the copies
// add up to at most the body.
func unquote(v []byte, start, end int) []byte {
	raw := v[start:end]
	if bytes.IndexByte(raw, '\\') < 0 || start == 0 || end >= len(v) {
		return raw
	}
	var s string
	if err := json.Unmarshal(v[start-1:end+1], &s); err != nil {
		return raw
	}
	return []byte(s)
}
