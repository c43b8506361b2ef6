package sidecar_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Bodies a token budget cannot size by its old reading, against the built sidecar, a real
// redis-server and an upstream that reads them as pydantic-based servers (vLLM, SGLang,
// LiteLLM) and llama.cpp do and counts the tokens it serves: a FixedWindow budget of 10,000
// tokens per X-API-Key, defaultHold 1000. Each variant has a key of its own.
//
// The budget's window is a UTC day, and the model counts what it serves by UTC day too, and
// no test starts in the last minutes of one (awayFromDayEnd): the model counts a token when it
// generates it, the sidecar when it admits the request, so a stream admitted at a window's end
// and served after it would count in the next window of the model beside that window's whole
// budget, an overshoot of the test's own making.

const (
	unsizedBudget = 10_000
	// naturalLength is what the model generates when nothing caps it.
	naturalLength = 5_000
	// attempts is how many requests each variant sends.
	attempts = 12
	// unsizedWindow is the budget's window: FixedWindow windows start at multiples of it.
	unsizedWindow = 24 * time.Hour
)

// countingModel is an OpenAI-compatible upstream that reads bodies leniently, as the servers
// named above do, and counts what it serves (prompt + generated tokens) per key and window.
type countingModel struct {
	*httptest.Server
	mu     sync.Mutex
	served map[string]int64 // "key window" -> tokens
}

func newCountingModel(t *testing.T) *countingModel {
	m := &countingModel{served: map[string]int64{}}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

// maxPerWindow is the most a key was served in any one window.
func (m *countingModel) maxPerWindow(key string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var most int64
	for k, v := range m.served {
		if strings.HasPrefix(k, key+" ") {
			most = max(most, v)
		}
	}
	return most
}

func (m *countingModel) count(key string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.served[key+" "+strconv.FormatInt(time.Now().UnixNano()/int64(unsizedWindow), 10)] += n
}

// lenientInt reads a count as pydantic's lax mode: an integer, an integral float, or a string
// of either.
func lenientInt(v any) (int64, bool) {
	var f float64
	switch x := v.(type) {
	case json.Number:
		var err error
		if f, err = strconv.ParseFloat(string(x), 64); err != nil {
			return 0, false
		}
	case string:
		var err error
		if f, err = strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	if f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}

func lenientBool(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case string:
		return strings.EqualFold(x, "true") || x == "1"
	case json.Number:
		return x == "1"
	}
	return false
}

// textBytes sums the string leaves of v.
func textBytes(v any) int64 {
	switch x := v.(type) {
	case string:
		return int64(len(x))
	case []any:
		var n int64
		for _, e := range x {
			n += textBytes(e)
		}
		return n
	case map[string]any:
		var n int64
		for k, e := range x {
			if k != "role" {
				n += textBytes(e)
			}
		}
		return n
	}
	return 0
}

func (m *countingModel) serve(w http.ResponseWriter, r *http.Request) {
	var rd io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rd = gz
	}
	dec := json.NewDecoder(rd)
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	path := strings.ToLower(r.URL.Path)
	key := r.Header.Get("X-API-Key")
	var prompt int64
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		prompt = textBytes(top["messages"])
	case strings.HasSuffix(path, "/completions"):
		prompt = textBytes(top["prompt"])
	case strings.HasSuffix(path, "/messages"):
		m.anthropicStream(w, r, key, top)
		return
	case strings.HasSuffix(path, "/embeddings"):
		in := (textBytes(top["input"]) + 3) / 4
		m.count(key, in)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, in, in)
		return
	default:
		http.NotFound(w, r)
		return
	}
	prompt = (prompt + 3) / 4
	// vLLM: max_completion_tokens or max_tokens; llama.cpp: -1 (or none) generates on
	out := int64(naturalLength)
	for _, f := range []string{"max_tokens", "max_completion_tokens"} {
		if n, ok := lenientInt(top[f]); ok && n > 0 {
			out = min(n, naturalLength)
		}
	}
	m.count(key, prompt+out)
	chat := !strings.HasSuffix(path, "/completions") || strings.HasSuffix(path, "/chat/completions")
	choice := func(text string) string {
		if chat {
			return `{"index":0,"delta":{"content":"` + text + `"}}`
		}
		return `{"index":0,"text":"` + text + `"}`
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, out, prompt+out)
	if !lenientBool(top["stream"]) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"%s"}}],"usage":%s}`, strings.Repeat(" tok", int(out)), usage)
		return
	}
	opts, _ := top["stream_options"].(map[string]any)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for sent := int64(0); sent < out; sent += 50 {
		n := min(50, out-sent)
		_, _ = fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[%s]}\n\n", choice(strings.Repeat(" tok", int(n))))
		_ = rc.Flush()
	}
	if opts != nil && lenientBool(opts["include_usage"]) {
		_, _ = fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// unsizedVariant is one body of the issue.
type unsizedVariant struct {
	name, path string
	body       func() []byte
	gzip, slow bool
	// refused is the status the default (Refuse) answers with; 0 when the body is now sized.
	refused int
}

func chatBody(extra string) func() []byte {
	return func() []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`)
	}
}

var unsizedVariants = []unsizedVariant{
	{name: "max_tokens 1e5", path: "/v1/chat/completions", body: chatBody(`,"max_tokens":1e5,"stream":true`)},
	{name: `max_tokens "100000"`, path: "/v1/chat/completions", body: chatBody(`,"max_tokens":"100000","stream":true`)},
	{name: "max_tokens 100000.0", path: "/v1/chat/completions", body: chatBody(`,"max_tokens":100000.0,"stream":true`)},
	{name: "max_tokens -1", path: "/v1/chat/completions", body: chatBody(`,"max_tokens":-1,"stream":true`)},
	{name: `stream "true"`, path: "/v1/chat/completions", body: chatBody(`,"stream":"true"`)},
	{name: "over 1 MiB of whitespace", path: "/v1/chat/completions", refused: http.StatusRequestEntityTooLarge, body: func() []byte {
		return []byte(`{"model":"m","max_tokens":100000,"stream":true,` + strings.Repeat(" ", 1<<20+1) + `"messages":[{"role":"user","content":"hi"}]}`)
	}},
	{name: "slower than 5s", path: "/v1/chat/completions", slow: true, refused: http.StatusRequestTimeout, body: chatBody(`,"max_tokens":100000,"stream":true`)},
	{name: "gzip", path: "/v1/chat/completions", gzip: true, refused: http.StatusUnsupportedMediaType, body: chatBody(`,"max_tokens":100000,"stream":true`)},
	{name: "/v1/completions", path: "/v1/completions", body: func() []byte {
		return []byte(`{"model":"m","prompt":"hi","max_tokens":100000,"stream":true}`)
	}},
	{name: "/v1/embeddings", path: "/v1/embeddings", body: func() []byte {
		return []byte(`{"model":"e","input":"` + strings.Repeat("word ", 32_000) + `"}`)
	}},
	{name: "/v1/Chat/Completions", path: "/v1/Chat/Completions", body: chatBody(`,"max_tokens":100000,"stream":true`)},
}

// send posts one variant's body as key; the answer's status.
func (v unsizedVariant) send(t *testing.T, proxy, key string) int {
	body := v.body()
	if v.gzip {
		var b bytes.Buffer
		gz := gzip.NewWriter(&b)
		_, _ = gz.Write(body)
		_ = gz.Close()
		body = b.Bytes()
	}
	var rd io.Reader = bytes.NewReader(body)
	if v.slow {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write(body[:10])
			time.Sleep(5500 * time.Millisecond)
			_, _ = pw.Write(body[10:])
			_ = pw.Close()
		}()
		rd = pr
	}
	req, err := http.NewRequest(http.MethodPost, proxy+v.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	if v.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Errorf("%s: %v", v.name, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// runVariants sends every variant, attempts times (sequentially; the slow one at once), each
// under a key of its own, and returns the statuses per variant.
func runVariants(t *testing.T, proxy, prefix string) map[string][]int {
	out := map[string][]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, v := range unsizedVariants {
		key := prefix + v.name
		if v.slow {
			for range attempts {
				wg.Go(func() {
					code := v.send(t, proxy, key)
					mu.Lock()
					out[v.name] = append(out[v.name], code)
					mu.Unlock()
				})
			}
			continue
		}
		for range attempts {
			code := v.send(t, proxy, key)
			mu.Lock()
			out[v.name] = append(out[v.name], code)
			mu.Unlock()
		}
	}
	wg.Wait()
	return out
}

func unsizedDocument(ns, unsized string) []byte {
	r := sidecartest.BudgetRule("tokens", "X-API-Key", "FixedWindow", unsizedBudget, 1000, 1, policydoc.OnErrorUsed)
	r.WindowMS = unsizedWindow.Milliseconds()
	r.Match = &policydoc.Match{PathPrefix: "/v1"}
	r.Cost.UnsizedBody = unsized
	return sidecartest.DocumentRules(ns, "llm", "app", r)
}

// TestUnsizedBodiesStayWithinTheBudget: with unsizedBody Refuse (the default) every body the
// sidecar cannot size is refused with the status naming why and the upstream serves no key
// more than the budget in a window; every body it now reads is capped to the budget. With
// Hold, a body it cannot size holds defaultHold with no cap written: what it streams is
// charged afterwards (debt), so a key is served at most the budget plus what the requests in
// flight at once generate uncapped.
//
// REDLINE_UNSIZED_BASELINE=<sidecar binary> runs the Hold document against that binary
// instead (a build of an earlier commit, which knows no unsizedBody) and logs what it served:
// the measurement before the change.
func TestUnsizedBodiesStayWithinTheBudget(t *testing.T) {
	if base := os.Getenv("REDLINE_UNSIZED_BASELINE"); base != "" {
		m, s := startUnsized(t, base, "")
		runVariants(t, s.proxy, "base ")
		for _, v := range unsizedVariants {
			t.Logf("baseline %-26s served %7d tokens in a window of %d", v.name, m.maxPerWindow("base "+v.name), unsizedBudget)
		}
		return
	}
	t.Run("Refuse", func(t *testing.T) {
		m, s := startUnsized(t, binary, policydoc.UnsizedRefuse)
		codes := runVariants(t, s.proxy, "refuse ")
		for _, v := range unsizedVariants {
			served := m.maxPerWindow("refuse " + v.name)
			t.Logf("Refuse %-26s served %7d tokens in a window of %d; statuses %v", v.name, served, unsizedBudget, codes[v.name])
			if served > unsizedBudget {
				t.Errorf("%s: the upstream served %d tokens in a window, over the budget %d", v.name, served, unsizedBudget)
			}
			for _, c := range codes[v.name] {
				switch {
				case v.refused != 0 && c != v.refused:
					t.Errorf("%s: answered %d, want %d (unsized, refused)", v.name, c, v.refused)
				case v.refused == 0 && c != http.StatusOK && c != http.StatusTooManyRequests:
					t.Errorf("%s: answered %d, want 200 or 429", v.name, c)
				}
			}
			if v.refused == 0 && v.name != "/v1/embeddings" && served == 0 {
				t.Errorf("%s: nothing served: a body the sidecar sizes goes through", v.name)
			}
		}
		reasons := map[string]string{"body_too_large": "", "body_too_slow": "", "body_compressed": ""}
		for reason := range reasons {
			sample := `redline_sidecar_unsized_refusals_total{policy="llm",reason="` + reason + `",rule="tokens"}`
			if got := s.metric(t, sample); got != attempts {
				t.Errorf("%s = %v, want %d", sample, got, attempts)
			}
		}
	})
	t.Run("Hold", func(t *testing.T) {
		m, s := startUnsized(t, binary, "")
		codes := runVariants(t, s.proxy, "hold ")
		for _, v := range unsizedVariants {
			served := m.maxPerWindow("hold " + v.name)
			t.Logf("Hold   %-26s served %7d tokens in a window of %d; statuses %v", v.name, served, unsizedBudget, codes[v.name])
			inFlight := int64(1)
			if v.slow {
				inFlight = attempts
			}
			if bound := unsizedBudget + inFlight*naturalLength; served > bound {
				t.Errorf("%s: the upstream served %d tokens in a window, over budget + %d in flight x %d = %d", v.name, served, inFlight, naturalLength, bound)
			}
		}
	})
}

func startUnsized(t *testing.T, bin, unsized string) (*countingModel, *sidecar) {
	awayFromDayEnd(t)
	m := newCountingModel(t)
	e := newEnv(t, "app")
	e.write(t, unsizedDocument(e.namespace, unsized))
	s := startBinary(t, bin, "unsized", e, shared.URL(), strings.TrimPrefix(m.URL, "http://"), true)
	return m, s
}

// awayFromDayEnd waits for the next UTC day when the current one has less than a few minutes
// left, so that a test of the unsized bodies (well under a minute) runs in one window.
func awayFromDayEnd(t *testing.T) {
	t.Helper()
	const margin = 5 * time.Minute
	now := time.Now()
	if left := now.Truncate(unsizedWindow).Add(unsizedWindow).Sub(now); left < margin {
		t.Logf("waiting %s for the next window", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
}

// anthropicStream streams an Anthropic message of max_tokens (at most naturalLength) tokens,
// 50 an event, a millisecond apart, counting each event's tokens as it is written, and stops
// when the client side goes away: the usage is message_start's (input, 1 output) until the
// closing message_delta.
func (m *countingModel) anthropicStream(w http.ResponseWriter, r *http.Request, key string, top map[string]any) {
	prompt := (textBytes(top["messages"]) + 3) / 4
	out := int64(naturalLength)
	if n, ok := lenientInt(top["max_tokens"]); ok && n > 0 {
		out = min(n, naturalLength)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	m.count(key, prompt)
	_, _ = fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", prompt)
	for sent := int64(0); sent < out; sent += 50 {
		if r.Context().Err() != nil {
			return
		}
		n := min(50, out-sent)
		m.count(key, n)
		_, _ = fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"%s\"}}\n\n", strings.Repeat(" tok", int(n)))
		if rc.Flush() != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	_, _ = fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":%d}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", out)
}

// cutAnthropicStreams sends attempts Anthropic streams as key, one at a time, each asking for
// the whole budget and cut by the client after about 2,000 tokens of text; a refused one is
// tried again 50 ms later, up to 10 times (the settle of the last cut runs after it).
func cutAnthropicStreams(t *testing.T, proxy, key string) []int {
	var codes []int
	for range attempts {
		for range 10 {
			req, err := http.NewRequest(http.MethodPost, proxy+"/v1/messages",
				strings.NewReader(`{"model":"m","max_tokens":10000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-API-Key", key)
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			code := resp.StatusCode
			if code == http.StatusOK {
				// about 2,000 tokens: 40 events of 50
				_, _ = io.CopyN(io.Discard, resp.Body, 40*330)
			}
			resp.Body.Close()
			if code != http.StatusTooManyRequests {
				codes = append(codes, code)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return codes
}

// TestCutAnthropicStreamIsChargedWhatItStreamed: a client that cuts an Anthropic stream after
// message_start reported input + 1 is charged what passed through the sidecar (its text), not
// message_start's usage alone, so the upstream serves a key at most the budget plus what was
// on its way to the sidecar when each stream was cut.
//
// REDLINE_UNSIZED_BASELINE=<sidecar binary> logs what an earlier build let through instead.
func TestCutAnthropicStreamIsChargedWhatItStreamed(t *testing.T) {
	bin, unsized, label := binary, policydoc.UnsizedRefuse, "after"
	if base := os.Getenv("REDLINE_UNSIZED_BASELINE"); base != "" {
		bin, unsized, label = base, "", "baseline"
	}
	m, s := startUnsized(t, bin, unsized)
	codes := cutAnthropicStreams(t, s.proxy, "cut")
	served := m.maxPerWindow("cut")
	t.Logf("%s: cut Anthropic streams served %d tokens in a window of %d; statuses %v", label, served, unsizedBudget, codes)
	if label == "baseline" {
		return
	}
	// what may be on its way at a cut: a few events of 50 tokens
	if bound := int64(unsizedBudget + 500); served > bound {
		t.Errorf("cut Anthropic streams: the upstream served %d tokens in a window, over %d", served, bound)
	}
}
