//nolint:goconst // the APIs' field names read best where each shape writes them, as their docs show them
package fakemodel

import (
	"encoding/json"
	"io"

	"github.com/redline-dev/redline/internal/tokens"
)

// model is the model every response names.
const model = "fake-model"

// usage is what a response reports.
type usage struct {
	in, out int64
	capped  bool // the output stopped at the request's cap
}

// shape writes one API's responses, as its documentation shows them (field order aside: the
// objects are maps, written with sorted keys).
type shape interface {
	start(e *emitter, g *gen)
	token(e *emitter, g *gen, text string, n int64)
	end(e *emitter, g *gen)
	fail(e *emitter, g *gen)
	body(u usage, text string, withUsage bool) any
	errorBody() any
}

var shapes = map[tokens.Kind]shape{
	tokens.OpenAIChat:      openAIChat{},
	tokens.OpenAIResponses: openAIResponses{},
	tokens.Anthropic:       anthropic{},
	tokens.Gemini:          gemini{},
}

type obj = map[string]any

func newEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

type openAIChat struct{}

func (openAIChat) chunk(g *gen, choices []any) obj {
	c := obj{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
		"system_fingerprint": "fp_fake", "choices": choices}
	if g.usageNull {
		c["usage"] = nil
	}
	return c
}

func (o openAIChat) delta(g *gen, delta obj, finish any) obj {
	return o.chunk(g, []any{obj{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}})
}

func (o openAIChat) start(e *emitter, g *gen) {
	e.event("", o.delta(g, obj{"role": "assistant", "content": ""}, nil))
}

func (o openAIChat) token(e *emitter, g *gen, text string, _ int64) {
	e.event("", o.delta(g, obj{"content": text}, nil))
}

func (o openAIChat) end(e *emitter, g *gen) {
	e.event("", o.delta(g, obj{}, finishReason(g.capped, "length", "stop")))
	if g.bodyUsage {
		c := o.chunk(g, []any{})
		c["usage"] = o.usage(g.usage())
		e.event("", c)
	}
	e.raw("", []byte("[DONE]"))
}

func (openAIChat) usage(u usage) obj {
	return obj{"prompt_tokens": u.in, "completion_tokens": u.out, "total_tokens": u.in + u.out}
}

func (o openAIChat) fail(e *emitter, _ *gen) { e.event("", o.errorBody()) }

func (o openAIChat) body(u usage, text string, withUsage bool) any {
	b := obj{"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
		"choices": []any{obj{"index": 0, "message": obj{"role": "assistant", "content": text, "refusal": nil},
			"logprobs": nil, "finish_reason": finishReason(u.capped, "length", "stop")}}}
	if withUsage {
		b["usage"] = o.usage(u)
	}
	return b
}

func (openAIChat) errorBody() any {
	return obj{"error": obj{"message": "The server had an error while processing your request.",
		"type": "server_error", "param": nil, "code": nil}}
}

type openAIResponses struct{}

func (openAIResponses) response(status string, u any) obj {
	r := obj{"id": "resp_fake", "object": "response", "created_at": 0, "status": status, "model": model,
		"output": []any{}, "usage": u}
	if status == "incomplete" {
		r["incomplete_details"] = obj{"reason": "max_output_tokens"}
	}
	return r
}

func (o openAIResponses) start(e *emitter, g *gen) {
	e.event("response.created", obj{"type": "response.created", "sequence_number": 0,
		"response": o.response("in_progress", nil)})
}

func (openAIResponses) token(e *emitter, _ *gen, text string, n int64) {
	e.event("response.output_text.delta", obj{"type": "response.output_text.delta", "sequence_number": n,
		"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": text})
}

func (o openAIResponses) end(e *emitter, g *gen) {
	typ, status := "response.completed", "completed"
	if g.capped {
		typ, status = "response.incomplete", "incomplete"
	}
	var u any
	if g.bodyUsage {
		u = o.usage(g.usage())
	}
	e.event(typ, obj{"type": typ, "sequence_number": g.serve + 1, "response": o.response(status, u)})
}

func (openAIResponses) usage(u usage) obj {
	return obj{"input_tokens": u.in, "input_tokens_details": obj{"cached_tokens": 0},
		"output_tokens": u.out, "output_tokens_details": obj{"reasoning_tokens": 0}, "total_tokens": u.in + u.out}
}

func (openAIResponses) fail(e *emitter, g *gen) {
	e.event("error", obj{"type": "error", "code": "server_error", "message": "The server had an error.",
		"param": nil, "sequence_number": g.serve + 1})
}

func (o openAIResponses) body(u usage, text string, withUsage bool) any {
	status := finishReason(u.capped, "incomplete", "completed")
	b := obj{"id": "resp_fake", "object": "response", "created_at": 0, "status": status, "model": model, "error": nil,
		"output": []any{obj{"type": "message", "id": "msg_fake", "status": status, "role": "assistant",
			"content": []any{obj{"type": "output_text", "text": text, "annotations": []any{}}}}}}
	if withUsage {
		b["usage"] = o.usage(u)
	}
	return b
}

func (openAIResponses) errorBody() any {
	return obj{"error": obj{"message": "The server had an error.", "type": "server_error", "param": nil, "code": "server_error"}}
}

type anthropic struct{}

func (anthropic) start(e *emitter, g *gen) {
	msg := obj{"id": "msg_fake", "type": "message", "role": "assistant", "content": []any{}, "model": model,
		"stop_reason": nil, "stop_sequence": nil}
	if g.bodyUsage {
		// as the API does: the output count of message_start is 1, message_delta's is the total
		msg["usage"] = obj{"input_tokens": g.in, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
	}
	e.event("message_start", obj{"type": "message_start", "message": msg})
	e.event("content_block_start", obj{"type": "content_block_start", "index": 0, "content_block": obj{"type": "text", "text": ""}})
	e.event("ping", obj{"type": "ping"})
}

func (anthropic) token(e *emitter, _ *gen, text string, _ int64) {
	e.event("content_block_delta", obj{"type": "content_block_delta", "index": 0, "delta": obj{"type": "text_delta", "text": text}})
}

func (anthropic) end(e *emitter, g *gen) {
	e.event("content_block_stop", obj{"type": "content_block_stop", "index": 0})
	d := obj{"type": "message_delta", "delta": obj{"stop_reason": finishReason(g.capped, "max_tokens", "end_turn"), "stop_sequence": nil}}
	if g.bodyUsage {
		d["usage"] = obj{"output_tokens": g.serve}
	}
	e.event("message_delta", d)
	e.event("message_stop", obj{"type": "message_stop"})
}

func (anthropic) fail(e *emitter, _ *gen) {
	e.event("error", obj{"type": "error", "error": obj{"type": "overloaded_error", "message": "Overloaded"}})
}

func (anthropic) body(u usage, text string, withUsage bool) any {
	b := obj{"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
		"content": []any{obj{"type": "text", "text": text}}, "stop_reason": finishReason(u.capped, "max_tokens", "end_turn"),
		"stop_sequence": nil}
	if withUsage {
		b["usage"] = obj{"input_tokens": u.in, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": u.out}
	}
	return b
}

func (anthropic) errorBody() any {
	return obj{"type": "error", "error": obj{"type": "api_error", "message": "Internal server error"}}
}

type gemini struct{}

// chunk is one GenerateContentResponse; n is the output so far (Gemini reports its usage,
// cumulative, in every chunk).
func (gemini) chunk(in int64, text, finish string, n int64, withUsage bool) obj {
	cand := obj{"content": obj{"parts": []any{obj{"text": text}}, "role": "model"}, "index": 0}
	if finish != "" {
		cand["finishReason"] = finish
	}
	c := obj{"candidates": []any{cand}, "modelVersion": model}
	if withUsage {
		c["usageMetadata"] = obj{"promptTokenCount": in, "candidatesTokenCount": n, "totalTokenCount": in + n}
	}
	return c
}

func (gemini) start(*emitter, *gen) {}

func (m gemini) token(e *emitter, g *gen, text string, n int64) {
	e.event("", m.chunk(g.in, text, "", n, g.bodyUsage))
}

func (m gemini) end(e *emitter, g *gen) {
	e.event("", m.chunk(g.in, "", finishReason(g.capped, "MAX_TOKENS", "STOP"), g.serve, g.bodyUsage))
}

func (m gemini) fail(e *emitter, _ *gen) { e.event("", m.errorBody()) }

func (m gemini) body(u usage, text string, withUsage bool) any {
	return m.chunk(u.in, text, finishReason(u.capped, "MAX_TOKENS", "STOP"), u.out, withUsage)
}

func (gemini) errorBody() any {
	return obj{"error": obj{"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}}
}

func finishReason(capped bool, atCap, done string) string {
	if capped {
		return atCap
	}
	return done
}
