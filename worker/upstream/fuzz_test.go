package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// streamCanary stands for a prompt, a key or a provider's own text: a
// provider stream may carry it anywhere (the seeds put it in error events'
// messages, types and codes), and no Error may repeat it.
const streamCanary = "s3cr3t-canary"

// streamAPI is one provider stream parser as the fuzz targets drive it.
type streamAPI struct {
	name    string
	fixture string // the prefix of its testdata/*.sse streams
	open    func(Options) (Upstream, error)
	dialect schemas.Dialect
}

// streamBody runs one attempt of api whose provider answers 200 with body
// as its event stream, in memory.
func streamBody(t *testing.T, api streamAPI, body []byte) (Outcome, error, *orderSink) {
	t.Helper()
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{
			StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(bytes.NewReader(body)), Request: r,
		}, nil
	})}
	up, err := api.open(Options{BaseURL: "http://provider.invalid/v1", Model: "m", APIKey: "sk-" + streamCanary,
		Client: client, Now: func() time.Time { return fixedNow }, StallAfterFirstToken: -1})
	if err != nil {
		t.Fatal(err)
	}
	req := hello()
	req.Dialect = api.dialect
	req.Messages[0].Content = schemas.TextContent(streamCanary)
	var sink orderSink
	out, err := up.Stream(context.Background(), req, &sink)
	return out, err, &sink
}

// orderSink records a stream's deltas and fails on a first byte that is
// not the first report or comes twice.
type orderSink struct {
	firstBytes int
	deltas     []Delta
	violation  string
}

func (s *orderSink) FirstByte() {
	s.firstBytes++
	if s.firstBytes > 1 || len(s.deltas) > 0 {
		s.violation = "a first byte after a delta or a second first byte"
	}
}

func (s *orderSink) Delta(d Delta) {
	if s.firstBytes == 0 {
		s.violation = "a delta before the first byte"
	}
	s.deltas = append(s.deltas, d)
}

// checkStream fails t unless api reads body as a provider stream should:
// the error is nil or an *Error repeating nothing the stream carried; a
// stream without an error has a finish reason; the sink hears the first
// byte once, before any delta, and the deltas add up to the outcome's
// content; usage is never negative; tool calls are JSON.
func checkStream(t *testing.T, api streamAPI, body []byte) {
	t.Helper()
	out, err, sink := streamBody(t, api, body)
	if err != nil {
		var ue *Error
		if !errors.As(err, &ue) {
			t.Fatalf("%s stream %q: error %v is %T, not an *Error", api.name, body, err, err)
		}
		if strings.Contains(err.Error(), streamCanary) {
			t.Fatalf("%s stream %q: error %q repeats what the stream or request carried", api.name, body, err)
		}
		if ue.Status == "" || ue.Scope == "" {
			t.Fatalf("%s stream %q: error %+v is unclassified", api.name, body, ue)
		}
	} else if out.FinishReason == "" {
		t.Fatalf("%s stream %q: no error and no finish reason", api.name, body)
	}
	if out.WellFormed && (err != nil || out.FinishReason == "") {
		t.Fatalf("%s stream %q: well formed with error %v, finish reason %q", api.name, body, err, out.FinishReason)
	}
	if sink.violation != "" {
		t.Fatalf("%s stream %q: %s", api.name, body, sink.violation)
	}
	var content strings.Builder
	for _, d := range sink.deltas {
		content.WriteString(d.Content)
		if d.Tokens < 0 || d.ToolCalls != nil && !json.Valid(d.ToolCalls) {
			t.Fatalf("%s stream %q: delta %+v", api.name, body, d)
		}
	}
	if content.String() != out.Content {
		t.Fatalf("%s stream %q: deltas say %q, the outcome %q", api.name, body, content.String(), out.Content)
	}
	if u := out.Usage; u.InputUnits < 0 || u.OutputUnits < 0 {
		t.Fatalf("%s stream %q: usage %+v", api.name, body, u)
	}
	if out.ToolCalls != nil && !json.Valid(out.ToolCalls) {
		t.Fatalf("%s stream %q: tool calls %s are not JSON", api.name, body, out.ToolCalls)
	}
}

// fuzzStream seeds f with api's recorded streams and errors carrying the
// canary, and fuzzes checkStream.
func fuzzStream(f *testing.F, api streamAPI, errorEvents ...string) {
	paths, err := filepath.Glob(filepath.Join("testdata", api.fixture+"*.sse"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no testdata/%s*.sse streams (%v)", api.fixture, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, e := range errorEvents {
		f.Add([]byte(e))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkStream(t, api, body) })
}

var openAIStreams = streamAPI{name: "chat completions", fixture: "stream_", dialect: schemas.DialectOpenAI,
	open: func(cfg Options) (Upstream, error) { return NewOpenAI(cfg) }}

func FuzzOpenAIStream(f *testing.F) {
	fuzzStream(f, openAIStreams,
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\nevent: error\ndata: {\"error\":{\"message\":\""+streamCanary+"\",\"type\":\""+streamCanary+"\",\"code\":\""+streamCanary+"\",\"param\":\""+streamCanary+"\"}}\n\n",
		"data: {\"error\":{\"message\":\"context_length_exceeded "+streamCanary+"\",\"type\":\"invalid_request_error\",\"code\":\"rate_limit_exceeded\"}}\n\n",
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\"}}]}}]}\n\n"+
			"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
	)
}

func FuzzAnthropicStream(f *testing.F) {
	fuzzStream(f, streamAPI{name: "messages", fixture: "anthropic_stream_", dialect: schemas.DialectAnthropic,
		open: func(cfg Options) (Upstream, error) { return NewAnthropic(AnthropicOptions{Options: cfg}) }},
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\""+streamCanary+"\",\"message\":\""+streamCanary+"\"}}\n\n",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded "+streamCanary+"\"}}\n\n",
	)
}

func FuzzResponsesStream(f *testing.F) {
	fuzzStream(f, streamAPI{name: "responses", fixture: "responses_stream_", dialect: schemas.DialectResponses,
		open: func(cfg Options) (Upstream, error) { return NewOpenAI(cfg) }},
		"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\""+streamCanary+"\",\"message\":\""+streamCanary+"\"}}}\n\n",
		"event: error\ndata: {\"type\":\"error\",\"code\":\""+streamCanary+"\",\"message\":\""+streamCanary+"\"}\n\n",
	)
}

// TestToolCallFragmentsWithAnIndexAloneAreNotOutput: a chunk whose
// tool_calls carry nothing the model generated — an empty array, or
// fragments with an index alone — is no Delta: it would come before the
// first byte and count a token (found by FuzzOpenAIStream).
func TestToolCallFragmentsWithAnIndexAloneAreNotOutput(t *testing.T) {
	for _, calls := range []string{`[]`, `[{"index":0}]`, `[{"index":0,"function":{}}]`} {
		t.Run(calls, func(t *testing.T) {
			body := "data: {\"choices\":[{\"delta\":{\"tool_calls\":" + calls + "}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
			out, err, sink := streamBody(t, openAIStreams, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if sink.violation != "" || sink.firstBytes != 1 || len(sink.deltas) != 1 || sink.deltas[0].Content != "hi" {
				t.Errorf("sink heard %d first bytes, deltas %+v (%s)", sink.firstBytes, sink.deltas, sink.violation)
			}
			if out.Content != "hi" || out.FinishReason != "stop" {
				t.Errorf("outcome %+v", out)
			}
		})
	}
}
