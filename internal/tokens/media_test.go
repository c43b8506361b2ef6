package tokens

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// parts joins n copies of part into a JSON list.
func parts(n int, part string) string {
	return "[" + strings.TrimSuffix(strings.Repeat(part+",", n), ",") + "]"
}

// Many images with a tiny output cap: the hold is the images' price, not the
// few bytes of their URLs.
func TestScanRequestPricesImages(t *testing.T) {
	const n = 500
	tests := []struct {
		name string
		kind Kind
		body string
		per  int64
	}{
		{"chat image_url", OpenAIChat,
			`{"max_tokens":1,"messages":[{"role":"user","content":` + parts(n, `{"type":"image_url","image_url":{"url":"https://x.invalid/a.png"}}`) + `}]}`,
			OpenAIImageHigh},
		{"chat image_url detail high", OpenAIChat,
			`{"max_tokens":1,"messages":[{"role":"user","content":` + parts(n, `{"image_url":{"detail":"high","url":"https://x.invalid/a.png"},"type":"image_url"}`) + `}]}`,
			OpenAIImageHigh},
		{"chat image_url detail low", OpenAIChat,
			`{"max_tokens":1,"messages":[{"role":"user","content":` + parts(n, `{"type":"image_url","image_url":{"url":"https://x.invalid/a.png","detail":"low"}}`) + `}]}`,
			OpenAIImageLow},
		{"responses input_image", OpenAIResponses,
			`{"max_output_tokens":16,"input":[{"role":"user","content":` + parts(n, `{"type":"input_image","image_url":"data:image/png;base64,AAAA"}`) + `}]}`,
			OpenAIImageHigh},
		{"responses input_image low", OpenAIResponses,
			`{"max_output_tokens":16,"input":[{"role":"user","content":` + parts(n, `{"detail":"low","type":"input_image","file_id":"file-1"}`) + `}]}`,
			OpenAIImageLow},
		{"anthropic image", Anthropic,
			`{"max_tokens":1,"messages":[{"role":"user","content":` + parts(n, `{"type":"image","source":{"type":"url","url":"https://x.invalid/a.png"}}`) + `}]}`,
			AnthropicImage},
		{"anthropic image in a tool result", Anthropic,
			`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":` + parts(n, `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}`) + `}]}]}`,
			AnthropicImage},
		{"chat escaped type and detail", OpenAIChat,
			`{"max_tokens":1,"messages":[{"role":"user","content":` + parts(n, `{"type":"image\u005furl","image_url":{"url":"u","det\u0061il":"high"}}`) + `}]}`,
			OpenAIImageHigh},
		{"gemini inlineData", Gemini,
			`{"generationConfig":{"maxOutputTokens":1},"contents":[{"role":"user","parts":` + parts(n, `{"inlineData":{"mimeType":"image/png","data":"AAAA"}}`) + `}]}`,
			GeminiImage},
		{"gemini file_data", Gemini,
			`{"contents":[{"parts":` + parts(n, `{"file_data":{"file_uri":"gs://b/a.jpg","mime_type":"image/jpeg"}}`) + `}]}`,
			GeminiImage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ScanRequest([]byte(tt.body), tt.kind, false)
			if err != nil {
				t.Fatalf("ScanRequest: %v", err)
			}
			if min := n * tt.per; got.PromptTokens < min || got.PromptTokens > min+n*30 {
				t.Errorf("PromptTokens = %d, want %d images at %d (%d) plus a little text", got.PromptTokens, n, tt.per, min)
			}
		})
	}
}

func TestScanRequestRefusesWhatItCannotPrice(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
	}{
		{"chat file", OpenAIChat, `{"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`},
		{"chat input_audio", OpenAIChat, `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`},
		{"responses input_file", OpenAIResponses, `{"input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x.invalid/a.pdf"}]}]}`},
		{"responses item_reference", OpenAIResponses, `{"input":[{"type":"item_reference","id":"msg_1"}]}`},
		{"responses previous_response_id", OpenAIResponses, `{"input":"hi","previous_response_id":"resp_1"}`},
		{"responses conversation", OpenAIResponses, `{"input":"hi","conversation":{"id":"conv_1"}}`},
		{"responses stored prompt", OpenAIResponses, `{"input":"hi","prompt":{"id":"pmpt_1"}}`},
		{"anthropic document", Anthropic, `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x.invalid/a.pdf"}}]}]}`},
		{"anthropic container_upload", Anthropic, `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"container_upload","file_id":"file_1"}]}]}`},
		{"gemini pdf", Gemini, `{"contents":[{"parts":[{"inlineData":{"mimeType":"application/pdf","data":"AAAA"}}]}]}`},
		{"gemini video file", Gemini, `{"contents":[{"parts":[{"fileData":{"mimeType":"video/mp4","fileUri":"gs://b/a.mp4"}}]}]}`},
		{"gemini file without a type", Gemini, `{"contents":[{"parts":[{"file_data":{"file_uri":"gs://b/a"}}]}]}`},
		{"chat escaped type", OpenAIChat, `{"messages":[{"role":"user","content":[{"ty\u0070e":"inp\u0075t_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`},
		{"vllm video_url", OpenAIChat, `{"messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"https://x.invalid/a.mp4"}}]}]}`},
		{"gemini escaped key", Gemini, `{"contents":[{"parts":[{"inline\u0044ata":{"mimeType":"audio/wav","data":"AAAA"}}]}]}`},
		{"gemini cachedContent", Gemini, `{"contents":[{"parts":[{"text":"hi"}]}],"cachedContent":"cachedContents/abc"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ScanRequest([]byte(tt.body), tt.kind, false)
			if !errors.Is(err, ErrNotPriced) {
				t.Fatalf("ScanRequest error = %v, want ErrNotPriced", err)
			}
		})
	}
}

// Text that looks like a part, absent server-side context and tool schemas
// cost what their text costs.
func TestScanRequestTextIsNotMedia(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
	}{
		{"chat text naming a type", OpenAIChat, `{"messages":[{"role":"user","content":"{\"type\":\"file\"}"}]}`},
		{"chat tool schema with a file type", OpenAIChat, `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"file"}}}}}]}`},
		{"responses null context", OpenAIResponses, `{"input":"hi","previous_response_id":null,"conversation":null}`},
		{"gemini text", Gemini, `{"contents":[{"parts":[{"text":"image/png"}]}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ScanRequest([]byte(tt.body), tt.kind, false)
			if err != nil {
				t.Fatalf("ScanRequest: %v", err)
			}
			if got.PromptTokens >= OpenAIImageLow {
				t.Errorf("PromptTokens = %d, want text only", got.PromptTokens)
			}
		})
	}
}

// The scan is one pass: a body of the largest size with as many parts as fit
// is priced per part, not refused nor cut short.
func TestScanRequestManyPartsAtMaxSize(t *testing.T) {
	part := `{"type":"image_url","image_url":{"url":"u","detail":"low"}}`
	n := (MaxRequestBytes - 100) / (len(part) + 1)
	body := fmt.Sprintf(`{"max_tokens":1,"messages":[{"role":"user","content":%s}]}`, parts(n, part))
	got, err := ScanRequest([]byte(body), OpenAIChat, false)
	if err != nil {
		t.Fatalf("ScanRequest: %v", err)
	}
	if want := int64(n) * OpenAIImageLow; got.PromptTokens < want {
		t.Errorf("PromptTokens = %d, want at least %d", got.PromptTokens, want)
	}
}
