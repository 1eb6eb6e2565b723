package fakellm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// rawEvent is one server-sent event as sent: its name (empty for OpenAI's
// chat chunks) and its data line.
type rawEvent struct {
	name, data string
}

// rawEvents splits a stream into its events without judging their data.
func rawEvents(t *testing.T, body string) []rawEvent {
	t.Helper()
	var events []rawEvent
	var e rawEvent
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if e.data != "" {
				events = append(events, e)
			}
			e = rawEvent{}
		case strings.HasPrefix(line, "event: "):
			e.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			e.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("stream line %q is neither event nor data", line)
		}
	}
	if e.data != "" {
		t.Fatalf("the stream ends inside an event: %+v", e)
	}
	return events
}

// tokenText is the text a token event of any API carries; ok is false for
// an event that carries none.
func tokenText(e rawEvent) (string, bool) {
	var d struct {
		Choices []struct {
			Delta struct{ Content string } `json:"delta"`
		} `json:"choices"`
		Delta json.RawMessage `json:"delta"`
	}
	if json.Unmarshal([]byte(e.data), &d) != nil {
		return "", false
	}
	switch e.name {
	case "":
		if len(d.Choices) == 1 && d.Choices[0].Delta.Content != "" {
			return d.Choices[0].Delta.Content, true
		}
	case "content_block_delta":
		var text struct{ Text string }
		if json.Unmarshal(d.Delta, &text) == nil && text.Text != "" {
			return text.Text, true
		}
	case "response.output_text.delta":
		var text string
		if json.Unmarshal(d.Delta, &text) == nil && text != "" {
			return text, true
		}
	}
	return "", false
}

// truncatedStreams are the streaming requests of each API, with what a
// stream cut at its length limit ends with there.
var truncatedStreams = []struct {
	path string
	body func(prompt string) string
	// final checks the stream's final events: a well-formed end at the
	// length limit whose usage counts output tokens.
	final func(t *testing.T, body []byte, output int) (text string)
}{
	{"/v1/chat/completions", func(prompt string) string {
		return chatBody(prompt, `"stream":true,"stream_options":{"include_usage":true}`)
	}, func(t *testing.T, body []byte, output int) string {
		s := parseStream(t, body, true)
		if s.finishReason != "length" || s.usage.CompletionTokens != output || s.tokens != output {
			t.Errorf("finish %q, usage %+v, %d tokens; want length and %d tokens", s.finishReason, s.usage, s.tokens, output)
		}
		return s.content
	}},
	{"/v1/messages", func(prompt string) string {
		return messagesBody(prompt, 1000, `"stream":true`)
	}, func(t *testing.T, body []byte, output int) string {
		s := readMessagesStream(t, body)
		if s.stopReason != "max_tokens" || s.outputTokens != float64(output) || s.deltas != output {
			t.Errorf("stop reason %q, output tokens %v, %d deltas; want max_tokens and %d", s.stopReason, s.outputTokens, s.deltas, output)
		}
		return s.text
	}},
	{"/v1/responses", func(prompt string) string {
		return responsesBody(prompt, `"stream":true`)
	}, func(t *testing.T, body []byte, output int) string {
		var text, done string
		var last namedEvent
		for i, e := range parseNamedSSE(t, body) {
			if e.data["sequence_number"] != float64(i) {
				t.Fatalf("event %d: sequence_number %v", i, e.data["sequence_number"])
			}
			switch e.name {
			case "response.output_text.delta":
				text += e.data["delta"].(string)
			case "response.output_text.done":
				done = e.data["text"].(string)
			}
			last = e
		}
		if last.name != "response.incomplete" {
			t.Fatalf("the stream ends with %s, want response.incomplete", last.name)
		}
		final := last.data["response"].(map[string]any)
		details, _ := final["incomplete_details"].(map[string]any)
		if final["status"] != "incomplete" || details["reason"] != "max_output_tokens" || done != text ||
			final["usage"].(map[string]any)["output_tokens"] != float64(output) {
			t.Errorf("final response %v, done %q; want incomplete at max_output_tokens with %d output tokens and the text %q",
				final, done, output, text)
		}
		return text
	}},
}

// TestAMalformedOrTruncatedStreamEndsAsItsModeSays: after N content
// tokens, a malformed break sends one event whose data is not JSON where
// the next token's would come and ends the body cleanly, with no final
// event; a truncated one ends the stream well-formed at its length limit,
// in each API's words, its usage the N tokens sent. Either way the record
// says so and bills the N tokens.
func TestAMalformedOrTruncatedStreamEndsAsItsModeSays(t *testing.T) {
	const answer, prompt = 10, "break me"
	m := steadyModel(t, answer)
	full := tokens(fullText(t, m, prompt, 0))
	for _, tc := range []struct {
		mode  fakellm.BreakMode
		after int
	}{
		{fakellm.BreakMalformed, 0}, {fakellm.BreakMalformed, 3}, {fakellm.BreakTruncate, 1}, {fakellm.BreakTruncate, 3},
	} {
		for _, api := range truncatedStreams {
			t.Run(fmt.Sprintf("%s after %d tokens %s", tc.mode, tc.after, api.path), func(t *testing.T) {
				fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale,
					BreakShare: 1, BreakAfter: tc.after, BreakMode: tc.mode})
				resp := fs.do(t, context.Background(), http.MethodPost, api.path, api.body(prompt))
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || err != nil {
					t.Fatalf("status %d, reading the body: %v", resp.StatusCode, err)
				}
				want := strings.Join(full[:tc.after], "")
				rec := fs.nextRecord(t)
				if rec.Break != tc.mode || rec.TokensSent != tc.after || rec.BilledOutputTokens != int64(tc.after) ||
					rec.OutputTokens != answer {
					t.Errorf("record %+v", rec)
				}
				if tc.mode == fakellm.BreakTruncate {
					if text := api.final(t, body, tc.after); text != want {
						t.Errorf("the truncated stream said %q, want the first %d tokens %q", text, tc.after, want)
					}
					if rec.End != fakellm.EndCompleted || rec.FinishReason != "length" {
						t.Errorf("record %+v: want a completed answer finished at its length", rec)
					}
					return
				}
				events := rawEvents(t, string(body))
				var text strings.Builder
				for i, e := range events[:len(events)-1] {
					if !json.Valid([]byte(e.data)) {
						t.Fatalf("event %d of %d is malformed: %+v", i, len(events), e)
					}
					if s, ok := tokenText(e); ok {
						text.WriteString(s)
					}
				}
				last := events[len(events)-1]
				if json.Valid([]byte(last.data)) || last.data == "[DONE]" {
					t.Errorf("the last event %+v is valid; want the malformed one", last)
				}
				if strings.Contains(last.data, strings.TrimSpace(full[tc.after])) {
					t.Errorf("the malformed event %+v carries the next token's text %q", last, full[tc.after])
				}
				if text.String() != want {
					t.Errorf("the stream said %q before its malformed event, want %q", text.String(), want)
				}
				if rec.End != fakellm.EndBroken || rec.FinishReason != "" {
					t.Errorf("record %+v: want a broken stream", rec)
				}
			})
		}
	}
}

// TestTheWorkersAdaptersReadAMalformedStreamAsTransientAndATruncatedOneAsCutShort
// runs hedgerow's provider adapters (worker/upstream) against the new
// breaks, in each API they speak: a malformed event ends the attempt as a
// transient server error — a failure another route may mend — and a
// truncated stream as an ok answer finished at its length ("length", the
// Messages max_tokens mapped to it) with the tokens sent as its usage,
// which the dispatcher reads as cut short below the max_tokens asked.
func TestTheWorkersAdaptersReadAMalformedStreamAsTransientAndATruncatedOneAsCutShort(t *testing.T) {
	const answer, after, maxTokens = 10, 4, 50
	m := steadyModel(t, answer)
	apis := []struct {
		name    string
		dialect schemas.Dialect
		adapter func(t *testing.T, base string) upstream.Upstream
	}{
		{"openai chat", "", func(t *testing.T, base string) upstream.Upstream {
			o, err := upstream.NewOpenAI(upstream.Options{BaseURL: base + "/v1", Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(o.CloseIdleConnections)
			return o
		}},
		{"openai responses", schemas.DialectResponses, func(t *testing.T, base string) upstream.Upstream {
			o, err := upstream.NewOpenAI(upstream.Options{BaseURL: base + "/v1", Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(o.CloseIdleConnections)
			return o
		}},
		{"anthropic messages", "", func(t *testing.T, base string) upstream.Upstream {
			a, err := upstream.NewAnthropic(upstream.AnthropicOptions{Options: upstream.Options{BaseURL: base, Model: "m"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(a.CloseIdleConnections)
			return a
		}},
	}
	for _, api := range apis {
		request := func() *schemas.ChatRequest {
			return &schemas.ChatRequest{Model: "m", Messages: conversation("adapt to this"), MaxTokens: maxTokens,
				Stream: true, Dialect: api.dialect}
		}
		// The unbroken answer, through the same adapter.
		whole, err := api.adapter(t, startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale}).http.URL).
			Stream(context.Background(), request(), nil)
		if err != nil || whole.FinishReason != "stop" || len(tokens(whole.Content)) != answer {
			t.Fatalf("%s: the unbroken answer %+v: %v", api.name, whole, err)
		}
		want := strings.Join(tokens(whole.Content)[:after], "")
		for _, mode := range []fakellm.BreakMode{fakellm.BreakMalformed, fakellm.BreakTruncate} {
			t.Run(fmt.Sprintf("%s %s", api.name, mode), func(t *testing.T) {
				fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale,
					BreakShare: 1, BreakAfter: after, BreakMode: mode})
				out, err := api.adapter(t, fs.http.URL).Stream(context.Background(), request(), nil)
				rec := fs.nextRecord(t)
				if rec.Break != mode {
					t.Fatalf("the provider did not break the stream: %+v", rec)
				}
				if out.Content != want {
					t.Errorf("the attempt read %q, want the %d tokens sent %q", out.Content, after, want)
				}
				switch mode {
				case fakellm.BreakMalformed:
					var ue *upstream.Error
					if !errors.As(err, &ue) || ue.Scope != schemas.ScopeTransient || ue.Status != schemas.StatusServerError {
						t.Errorf("a malformed event ended the attempt with %v (outcome %+v); want a transient server error", err, out)
					}
				case fakellm.BreakTruncate:
					if err != nil || out.FinishReason != "length" || out.Usage.OutputUnits != after || out.Usage.Estimated {
						t.Errorf("a truncated stream ended the attempt with %v, finish %q, usage %+v; want ok at length with %d output tokens",
							err, out.FinishReason, out.Usage, after)
					}
				}
			})
		}
	}
}
