package tokens

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// SetOutputCap returns body with the kind's output cap set to limit: OpenAI
// chat's max_completion_tokens (and max_tokens and llama.cpp's n_predict
// where present and not an integer within limit), completions' max_tokens
// (and n_predict),
// Responses' max_output_tokens, Anthropic's max_tokens, Gemini's
// generationConfig.maxOutputTokens (under the spellings of both names the
// body uses, camelCase where it uses none). With askUsage, an OpenAI chat or completions stream gets
// stream_options.include_usage true. Every other field keeps its value: the
// body goes through a map of raw values, so fields this package does not
// know survive (compacted, keys in sorted order, HTML characters unescaped).
// The body must pass ScanRequest.
func SetOutputCap(body []byte, kind Kind, limit int64, askUsage bool) ([]byte, error) {
	if limit < 0 || limit > MaxTokens {
		return nil, fmt.Errorf("tokens: output cap %d outside [0, MaxTokens]", limit)
	}
	req, err := ScanRequest(body, kind, false)
	if err != nil {
		return nil, err
	}
	if !req.HasOutput() {
		return nil, fmt.Errorf("%w: a %s body has no output cap", ErrShape, kind)
	}
	top, err := decodeTop(body, kind)
	if err != nil {
		return nil, err
	}
	capRaw := json.RawMessage(strconv.FormatInt(limit, 10))
	// keepOrCap leaves a field that already caps within limit as written, and sets any other
	// (over limit, -1, 0, a string, a float) to limit: the upstream reads the field as the
	// scanner did, and may read a string or a float, so the field is made an integer.
	keepOrCap := func(name string) {
		if v, ok := top[name]; ok {
			if n, _, err := parseCount(v); err != nil || n < 1 || n > limit {
				top[name] = capRaw
			}
		}
	}
	switch kind {
	case OpenAIChat, OpenAICompletions:
		if kind == OpenAIChat {
			top["max_completion_tokens"] = capRaw
			keepOrCap("max_tokens")
		} else {
			top["max_tokens"] = capRaw
		}
		keepOrCap("n_predict")
		if askUsage && req.Stream {
			opts := map[string]json.RawMessage{}
			if so := top["stream_options"]; firstByte(so) == '{' {
				if err := json.Unmarshal(so, &opts); err != nil {
					return nil, fmt.Errorf("tokens: reading stream_options: %w", err)
				}
			}
			opts["include_usage"] = json.RawMessage("true")
			if top["stream_options"], err = marshal(opts); err != nil {
				return nil, err
			}
		}
	case OpenAIResponses:
		top["max_output_tokens"] = capRaw
	case Anthropic:
		top["max_tokens"] = capRaw
	case Gemini:
		if err := setGeminiCap(top, capRaw); err != nil {
			return nil, err
		}
	}
	return marshal(top)
}

func marshal(m map[string]json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("tokens: writing the body: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// setGeminiCap sets generationConfig's maxOutputTokens to capRaw.
func setGeminiCap(top map[string]json.RawMessage, capRaw json.RawMessage) error {
	// Set the spellings the body uses, and only those: the upstream's
	// JSON mapping refuses a field given under both its names.
	names := []string{}
	for _, name := range []string{"generationConfig", "generation_config"} {
		if raw, ok := top[name]; ok && firstByte(raw) == '{' {
			names = append(names, name)
		} else if ok {
			delete(top, name) // null
		}
	}
	if len(names) == 0 {
		names = []string{"generationConfig"}
	}
	for _, name := range names {
		gc := map[string]json.RawMessage{}
		if raw, ok := top[name]; ok {
			if err := json.Unmarshal(raw, &gc); err != nil {
				return fmt.Errorf("tokens: reading %s: %w", name, err)
			}
		}
		set := false
		for _, field := range []string{"maxOutputTokens", "max_output_tokens"} {
			if _, ok := gc[field]; ok {
				gc[field], set = capRaw, true
			}
		}
		if !set && name == names[0] {
			gc["maxOutputTokens"] = capRaw
		}
		var err error
		if top[name], err = marshal(gc); err != nil {
			return err
		}
	}
	return nil
}
