package fakellm_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fastScale makes a model second a real millisecond, so a whole answer
// takes a few milliseconds.
const fastScale = 0.001

// recordWait bounds how long a test waits for a record that the server
// produces as soon as the client's action reaches it; reaching it is a
// failure, never a synchronization.
const recordWait = 10 * time.Second

// steadyModel is gpt4o without errors, hangs or stalls and with a fixed
// answer length, so a test knows what every request will do.
func steadyModel(t *testing.T, outputTokens int) *workload.Model {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT.HangFraction, m.TTFT.StallFraction = 0, 0
	m.OutputTokens = workload.LogNormal{Mu: math.Log(float64(outputTokens)), Sigma: 0}
	m.MaxOutputTokens = max(m.MaxOutputTokens, outputTokens)
	return m
}

// fakeServer runs a fake LLM behind httptest. Records are delivered on the
// returned channel as each request finishes.
type fakeServer struct {
	fake    *fakellm.Server
	http    *httptest.Server
	records chan fakellm.Record
	// arrived receives once per chat request that reached the provider, so
	// a test can act on a request the server is holding.
	arrived chan struct{}
}

func startServer(t *testing.T, cfg fakellm.Options) *fakeServer {
	t.Helper()
	fs := &fakeServer{records: make(chan fakellm.Record, 64), arrived: make(chan struct{}, 64)}
	cfg.OnRecord = func(r fakellm.Record) { fs.records <- r }
	cfg.OnStart = func() { fs.arrived <- struct{}{} }
	fake, err := fakellm.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	fs.fake = fake
	fs.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		fake.Close()
		fs.http.Close()
	})
	return fs
}

// nextRecord returns the next finished request's record.
func (fs *fakeServer) nextRecord(t *testing.T) fakellm.Record {
	t.Helper()
	select {
	case r := <-fs.records:
		return r
	case <-time.After(recordWait):
		t.Fatal("no record within the bound")
		return fakellm.Record{}
	}
}

func (fs *fakeServer) do(t *testing.T, ctx context.Context, method, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, fs.http.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := fs.http.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// post sends a chat request and returns the status, headers and body.
func (fs *fakeServer) post(t *testing.T, body string) (int, http.Header, []byte) {
	t.Helper()
	resp := fs.do(t, context.Background(), http.MethodPost, "/v1/chat/completions", body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, resp.Header, data
}

func chatBody(prompt string, extra string) string {
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":` + quote(prompt) + `}]`
	if extra != "" {
		extra = "," + extra
	}
	return `{"model":"gpt-4o","messages":` + msgs + extra + `}`
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// completion is a chat.completion as a client decodes it.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// chunk is a chat.completion.chunk as a client decodes it; Usage is raw so
// a test can tell an absent field from a null one.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
	raw   map[string]json.RawMessage
}

// parseSSE splits a text/event-stream body into its data payloads, failing
// on any line that is neither a data line nor an event separator.
func parseSSE(t *testing.T, body []byte) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("stream line %q is not a data line", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

// streamed is a parsed streaming answer.
type streamed struct {
	chunks       []chunk
	content      string
	tokens       int // content deltas, one per token
	finishReason string
	usage        *usage
}

// parseStream checks what every OpenAI streaming client relies on: each
// event but the last is a JSON chunk, the last is [DONE], every chunk has
// the same id, the first carries the assistant role, finish_reason is set
// exactly once, and a usage chunk, if any, has no choices and comes last.
func parseStream(t *testing.T, body []byte, includeUsage bool) streamed {
	t.Helper()
	events := parseSSE(t, body)
	if len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream of %d events does not end with [DONE]: %q", len(events), events)
	}
	var s streamed
	finishes := 0
	for i, e := range events[:len(events)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %d is not JSON: %v: %s", i, err, e)
		}
		if err := json.Unmarshal([]byte(e), &c.raw); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion.chunk" {
			t.Errorf("event %d object = %q", i, c.Object)
		}
		if i > 0 && c.ID != s.chunks[0].ID {
			t.Errorf("event %d id %q differs from the first %q", i, c.ID, s.chunks[0].ID)
		}
		_, hasUsage := c.raw["usage"]
		if hasUsage != includeUsage {
			t.Errorf("event %d has usage field = %v, want %v", i, hasUsage, includeUsage)
		}
		if s.usage != nil {
			t.Errorf("event %d comes after the usage chunk", i)
		}
		if len(c.Choices) == 0 {
			if !includeUsage {
				t.Fatalf("event %d has no choices but usage was not asked for: %s", i, e)
			}
			s.usage = new(usage)
			if err := json.Unmarshal(c.Usage, s.usage); err != nil || string(c.Usage) == "null" {
				t.Fatalf("usage chunk has usage %s: %v", c.Usage, err)
			}
		} else if includeUsage && string(c.Usage) != "null" {
			t.Errorf("event %d is a choice chunk with usage %s, want null", i, c.Usage)
		}
		for _, ch := range c.Choices {
			if i == 0 && ch.Delta.Role != "assistant" {
				t.Errorf("first chunk's role = %q, want assistant", ch.Delta.Role)
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				s.content += *ch.Delta.Content
				s.tokens++
			}
			if ch.FinishReason != nil {
				finishes++
				s.finishReason = *ch.FinishReason
			}
		}
		s.chunks = append(s.chunks, c)
	}
	if finishes != 1 {
		t.Errorf("finish_reason set in %d chunks, want 1", finishes)
	}
	if includeUsage && s.usage == nil {
		t.Error("no usage chunk although include_usage was set")
	}
	return s
}

// openAIError decodes an OpenAI error envelope, failing if the body is not
// one.
func openAIError(t *testing.T, body []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("body is not an OpenAI error: %v: %s", err, body)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error has empty message or type: %s", body)
	}
	var raw struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	_ = json.Unmarshal(body, &raw) // decoded above
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw.Error[k]; !ok {
			t.Errorf("error lacks %q: %s", k, body)
		}
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Type, code
}
