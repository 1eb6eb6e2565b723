package upstream

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

func TestStreamDeliversContentDeltasInOrderWithObservedUsage(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_content.sse")}))
	var rec recorder

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if rec.firstBytes != 1 {
		t.Errorf("FirstByte called %d times, want 1", rec.firstBytes)
	}
	wantDeltas := []Delta{{Content: "Hello", Tokens: 1}, {Content: " there", Tokens: 1}, {Content: "!", Tokens: 1}}
	if !reflect.DeepEqual(rec.deltas, wantDeltas) {
		t.Errorf("deltas = %+v, want %+v", rec.deltas, wantDeltas)
	}
	want := Outcome{
		FinishReason: "stop",
		Usage:        schemas.Usage{InputUnits: 19, OutputUnits: 3},
		Content:      "Hello there!",
		WellFormed:   true,
	}
	if out.MaxTokenGap <= 0 {
		t.Error("no gap measured between the stream's three tokens")
	}
	out.MaxTokenGap = 0 // a timing: TestTheOutcomeCarriesTheLongestGapBetweenTokensAfterTheFirst checks it
	if !reflect.DeepEqual(out, want) {
		t.Errorf("outcome = %+v, want %+v", out, want)
	}
}

func TestNonStreamingCallerGetsTheAccumulatedAnswerWithoutASink(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_content.sse")}))

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if out.Content != "Hello there!" || out.FinishReason != "stop" || !out.WellFormed {
		t.Errorf("outcome = %+v, want the whole answer, finished and well-formed", out)
	}
}

func TestToolCallDeltasAreForwardedRawAndJoinedByIndex(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_tool_calls.sse")}))
	var rec recorder

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if len(rec.deltas) != 5 {
		t.Fatalf("got %d deltas, want one per tool-call chunk (5): %+v", len(rec.deltas), rec.deltas)
	}
	first := `[{"index":0,"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":""}}]`
	if d := rec.deltas[0]; d.Content != "" || d.Tokens != 1 || !sameJSON(t, d.ToolCalls, []byte(first)) {
		t.Errorf("first delta = {%q %s %d}, want the raw fragment %s", d.Content, d.ToolCalls, d.Tokens, first)
	}
	wantCalls := `[
	  {"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"Paris\"}"}},
	  {"id":"call_def456","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}}
	]`
	if !sameJSON(t, out.ToolCalls, []byte(wantCalls)) {
		t.Errorf("tool calls = %s, want %s", out.ToolCalls, wantCalls)
	}
	if out.FinishReason != "tool_calls" || out.Content != "" || !out.WellFormed {
		t.Errorf("outcome = %+v, want finish tool_calls, no content, well-formed", out)
	}
	if want := (schemas.Usage{InputUnits: 82, OutputUnits: 17}); out.Usage != want {
		t.Errorf("usage = %+v, want %+v", out.Usage, want)
	}
}

func TestKeepAlivesAreIgnoredAndMultiLineDataIsOneEvent(t *testing.T) {
	lf := fixture(t, "stream_keepalive.sse")
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"LF line endings", lf},
		{"CRLF line endings", bytes.ReplaceAll(lf, []byte("\n"), []byte("\r\n"))},
		{"CR line endings", bytes.ReplaceAll(lf, []byte("\n"), []byte("\r"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, replay(answer{body: tc.body}))
			var rec recorder

			out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			if want := []Delta{{Content: "Hi", Tokens: 1}}; !reflect.DeepEqual(rec.deltas, want) {
				t.Errorf("deltas = %+v, want %+v", rec.deltas, want)
			}
			want := Outcome{FinishReason: "length", Usage: schemas.Usage{InputUnits: 5, OutputUnits: 1}, Content: "Hi", WellFormed: true}
			if !reflect.DeepEqual(out, want) {
				t.Errorf("outcome = %+v, want %+v", out, want)
			}
		})
	}
}

func TestMissingUsageChunkIsEstimatedFromCountedDeltas(t *testing.T) {
	var bodyLen atomic.Int64
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodyLen.Store(int64(len(b)))
		replay(answer{body: fixture(t, "stream_no_usage.sse")})(w, r)
	})

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := schemas.Usage{InputUnits: (bodyLen.Load() + 3) / 4, OutputUnits: 3, Estimated: true}
	if out.Usage != want {
		t.Errorf("usage = %+v, want %+v (input from the body length, output from 3 counted deltas)", out.Usage, want)
	}
	if !out.WellFormed || out.Content != "One two three" {
		t.Errorf("outcome = %+v, want a well-formed answer", out)
	}
}

func TestContinuousUsageStatisticsGiveTheTokenCountOfEachDelta(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_continuous_usage.sse")}))
	var rec recorder

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []Delta{{Content: "Multi-token chunk", Tokens: 4}, {Content: ".", Tokens: 1}}
	if !reflect.DeepEqual(rec.deltas, want) {
		t.Errorf("deltas = %+v, want %+v", rec.deltas, want)
	}
	if u := (schemas.Usage{InputUnits: 12, OutputUnits: 5}); out.Usage != u {
		t.Errorf("usage = %+v, want %+v", out.Usage, u)
	}
}

func TestFinishReasonWithoutDoneIsACompleteAnswerButNotWellFormed(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_finish_without_done.sse")}))

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v, want the complete answer", err)
	}
	if out.Content != "Complete." || out.FinishReason != "stop" || out.WellFormed {
		t.Errorf("outcome = %+v, want content and finish reason but WellFormed=false", out)
	}
	if !out.Usage.Estimated || out.Usage.OutputUnits != 1 {
		t.Errorf("usage = %+v, want an estimate of 1 output token", out.Usage)
	}
}

func TestBrokenStreamsFailTheAttemptWithWhatArrivedSoFar(t *testing.T) {
	for _, tc := range []struct {
		name        string
		answer      answer
		wantStatus  schemas.StatusClass
		wantScope   schemas.ErrorScope
		wantContent string
		wantMessage string
	}{
		{
			name:        "a stream cut before finish_reason is a transient server error",
			answer:      answer{body: fixture(t, "stream_cut.sse")},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeTransient,
			wantContent: "Partial",
			wantMessage: "before a finish reason",
		},
		{
			name:        "[DONE] without finish_reason is a transient server error",
			answer:      answer{body: fixture(t, "stream_done_without_finish.sse")},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeTransient,
			wantContent: "Partial",
			wantMessage: "before a finish reason",
		},
		{
			name:        "a malformed chunk is a transient server error and stops the read",
			answer:      answer{body: fixture(t, "stream_malformed.sse")},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeTransient,
			wantContent: "Partial",
			wantMessage: "malformed",
		},
		{
			name:        "an error chunk is classified by its type",
			answer:      answer{body: fixture(t, "stream_error_event.sse")},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeTransient,
			wantContent: "Partial",
			wantMessage: "server_error",
		},
		{
			name:       "an error event naming overload is pushback",
			answer:     answer{body: fixture(t, "stream_error_event_typed.sse")},
			wantStatus: schemas.StatusOverloaded,
			wantScope:  schemas.ScopePushback,
		},
		{
			name:        "an over-long event line is malformed",
			answer:      answer{body: []byte("data: " + strings.Repeat("x", MaxEventBytes) + "\n\n")},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeTransient,
			wantMessage: "malformed",
		},
		{
			name:        "a JSON answer where a stream was asked for is route-local",
			answer:      answer{contentType: "application/json", body: []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`)},
			wantStatus:  schemas.StatusServerError,
			wantScope:   schemas.ScopeRoute,
			wantMessage: "instead of an event stream",
		},
		{
			name:        "a JSON error inside a 200 is classified by its code",
			answer:      answer{contentType: "application/json", body: fixture(t, "error_429_rate_limit.json")},
			wantStatus:  schemas.StatusRateLimited,
			wantScope:   schemas.ScopePushback,
			wantMessage: "rate_limit_exceeded",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, replay(tc.answer))

			out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
			ue := asError(t, err)
			if ue.Status != tc.wantStatus || ue.Scope != tc.wantScope {
				t.Errorf("error = %v, want %s (%s)", ue, tc.wantStatus, tc.wantScope)
			}
			if !strings.Contains(ue.Message, tc.wantMessage) {
				t.Errorf("message %q does not mention %q", ue.Message, tc.wantMessage)
			}
			if out.WellFormed || out.Content != tc.wantContent {
				t.Errorf("outcome = %+v, want content %q and WellFormed=false", out, tc.wantContent)
			}
			if p.requests.Load() != 1 {
				t.Errorf("provider saw %d requests, want 1", p.requests.Load())
			}
		})
	}
}

func TestConnectionAbortedMidStreamIsTransient(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		body := fixture(t, "stream_content.sse")
		_, _ = w.Write(body[:bytes.Index(body, []byte(`" there"`))]) // cut inside an event
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the server drops the connection
	})

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	ue := asError(t, err)
	if ue.Status != schemas.StatusServerError || ue.Scope != schemas.ScopeTransient {
		t.Errorf("error = %v, want a transient server_error", ue)
	}
	if out.Content != "Hello" || out.WellFormed || !out.Usage.Estimated || out.Usage.OutputUnits != 1 {
		t.Errorf("outcome = %+v, want the partial answer with estimated usage", out)
	}
}

func TestConnectionIsReusedAfterAWellFormedStream(t *testing.T) {
	var (
		mu    sync.Mutex
		addrs []string
	)
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		addrs = append(addrs, r.RemoteAddr)
		mu.Unlock()
		replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
	})
	o := newAdapter(t, p, "")
	for range 2 {
		if _, err := o.Stream(context.Background(), hello(), nil); err != nil {
			t.Fatalf("Stream: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(addrs) != 2 || addrs[0] != addrs[1] {
		t.Errorf("client addresses %v, want the second attempt on the first one's connection", addrs)
	}
}
