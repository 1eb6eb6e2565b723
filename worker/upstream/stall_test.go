package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// stallingProvider serves opening, then keeps the stream open saying only
// keepAlive every 10 ms (pings, SSE comments: no token) until the adapter
// cuts the request, which closes cut.
func stallingProvider(t *testing.T, opening, keepAlive string) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	cut := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(opening))
		w.(http.Flusher).Flush()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				close(cut)
				return
			case <-tick.C:
				_, _ = w.Write([]byte(keepAlive))
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, cut
}

// A provider that goes silent after its first token (keep-alives and pings
// are not tokens) fails the attempt at the stall bound, as a transient
// error, with the connection cut — not at the attempt's deadline
// (docs/architecture.md §4 rule 4).
func TestAStreamSilentAfterItsFirstTokenFailsTransientAtTheStallBound(t *testing.T) {
	const bound = 100 * time.Millisecond
	tests := []struct {
		name    string
		adapter func(t *testing.T, url string) Upstream
		opening string
		alive   string
		want    string
	}{
		{"chat completions", func(t *testing.T, url string) Upstream {
			o, err := NewOpenAI(Options{BaseURL: url + "/v1", Model: "m", StallAfterFirstToken: bound})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}, openAIChunk(openAIRoleChunk) + openAIChunk(`{"content":"Hello"}`), ": keep-alive\n\n", "Hello"},
		{"messages", func(t *testing.T, url string) Upstream {
			a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: url, Model: "m", StallAfterFirstToken: bound}})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}, messagesOpening + messagesText(0, "Hello"), sseEvent("ping", `{"type": "ping"}`), "Hello"},
		{"the policy's bound, carried by the context", func(t *testing.T, url string) Upstream {
			o, err := NewOpenAI(Options{BaseURL: url + "/v1", Model: "m", StallAfterFirstToken: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			return policyBound{o, bound}
		}, openAIChunk(openAIRoleChunk) + openAIChunk(`{"content":"Hello"}`), ": keep-alive\n\n", "Hello"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, cut := stallingProvider(t, tc.opening, tc.alive)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var rec recorder
			out, err := tc.adapter(t, srv.URL).Stream(ctx, hello(), &rec)
			ue := asError(t, err)
			if ue.Status != schemas.StatusServerError || ue.Scope != schemas.ScopeTransient || !strings.Contains(ue.Message, "stalled") {
				t.Fatalf("error %+v, want a transient stall", ue)
			}
			if ctx.Err() != nil {
				t.Fatal("the stream ended at the attempt's deadline, not at the stall bound")
			}
			if rec.firstBytes != 1 || out.Content != tc.want {
				t.Errorf("first bytes %d, content %q: want the token before the stall", rec.firstBytes, out.Content)
			}
			select {
			case <-cut:
			case <-time.After(10 * time.Second):
				t.Fatal("the stalled provider's request was never cut")
			}
		})
	}
}

// The bound is per token: a stream whose tokens each come within it runs
// for longer than it, and a stream that has not produced its first token
// is not bound by it (the heartbeats and the hedge cover that wait).
func TestTheStallBoundIsPerTokenAndStartsAtTheFirstToken(t *testing.T) {
	const bound = 400 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(openAIChunk(openAIRoleChunk)))
		w.(http.Flusher).Flush()
		// Before the first token: silent for longer than the bound.
		tick := time.NewTicker(bound * 5 / 4)
		defer tick.Stop()
		<-tick.C
		// Then six tokens, each a quarter of the bound after the last.
		tick.Reset(bound / 4)
		for i := range 6 {
			_, _ = w.Write([]byte(openAIChunk(`{"content":"w` + string(rune('0'+i)) + ` "}`)))
			w.(http.Flusher).Flush()
			<-tick.C
		}
		_, _ = w.Write([]byte(openAIEnd))
	}))
	t.Cleanup(srv.Close)
	o, err := NewOpenAI(Options{BaseURL: srv.URL + "/v1", Model: "m", StallAfterFirstToken: bound})
	if err != nil {
		t.Fatal(err)
	}
	out, err := o.Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if out.Content != "w0 w1 w2 w3 w4 w5 " || out.FinishReason != "stop" {
		t.Fatalf("outcome %+v, want the whole answer", out)
	}
}

// pausingProvider serves parts in order; before part i it waits pauses[i],
// saying only keepAlive every 10 ms meanwhile (no token).
func pausingProvider(t *testing.T, keepAlive string, parts []string, pauses []time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i, part := range parts {
			end := time.NewTimer(pauses[i])
		wait:
			for {
				select {
				case <-r.Context().Done():
					end.Stop()
					return
				case <-tick.C:
					_, _ = w.Write([]byte(keepAlive))
					fl.Flush()
				case <-end.C:
					break wait
				}
			}
			_, _ = w.Write([]byte(part))
			fl.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The outcome of every dialect's stream carries the longest gap between two
// token arrivals after the first token, from which the dispatcher derives
// its cohort's stall bound (docs/architecture.md §4 rule 4): the longer of
// two pauses between tokens, however many keep-alives fill it. The wait
// before the first token is no gap, and neither is a stream of one token.
// The gaps are measured at the adapter, so one may come out a little
// shorter than the provider's pause (the token before it was read late):
// the test asks for three quarters of the longer pause, which the shorter
// one is well under, and asserts no upper bound.
func TestTheOutcomeCarriesTheLongestGapBetweenTokensAfterTheFirst(t *testing.T) {
	const short, long = 60 * time.Millisecond, 200 * time.Millisecond
	recorded, err := os.ReadFile("testdata/responses_stream_text.sse")
	if err != nil {
		t.Fatal(err)
	}
	responses := string(recorded)
	firstDelta := strings.Index(responses, "event: response.output_text.delta")
	secondDelta := firstDelta + 1 + strings.Index(responses[firstDelta+1:], "event: response.output_text.delta")
	chat := func(t *testing.T, url string) (Upstream, *schemas.ChatRequest) {
		o, err := NewOpenAI(Options{BaseURL: url + "/v1", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return o, hello()
	}
	tests := []struct {
		name        string
		adapter     func(t *testing.T, url string) (Upstream, *schemas.ChatRequest)
		keepAlive   string
		parts       []string
		pauses      []time.Duration
		wantAtLeast time.Duration // 0: no gap measured
	}{
		{"chat completions: the longer of two pauses", chat, ": keep-alive\n\n",
			[]string{openAIChunk(openAIRoleChunk) + openAIChunk(`{"content":"Hel"}`), openAIChunk(`{"content":"lo"}`), openAIChunk(`{"content":" you"}`) + openAIEnd},
			[]time.Duration{0, short, long}, long},
		{"chat completions: the wait before the first token is no gap", chat, ": keep-alive\n\n",
			[]string{openAIChunk(openAIRoleChunk), openAIChunk(`{"content":"Hello"}`) + openAIEnd},
			[]time.Duration{0, long}, 0},
		{"messages: pings are no tokens", func(t *testing.T, url string) (Upstream, *schemas.ChatRequest) {
			a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: url, Model: "m"}})
			if err != nil {
				t.Fatal(err)
			}
			return a, hello()
		}, sseEvent("ping", `{"type": "ping"}`),
			[]string{messagesOpening + messagesText(0, "Hel"), messagesText(0, "lo"), messagesText(0, " you") + messagesEnd(0, "end_turn")},
			[]time.Duration{0, long, short}, long},
		{"responses", func(t *testing.T, url string) (Upstream, *schemas.ChatRequest) {
			o, err := NewOpenAI(Options{BaseURL: url + "/v1", Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			return o, responsesCaller()
		}, ": keep-alive\n\n",
			[]string{responses[:secondDelta], responses[secondDelta:]},
			[]time.Duration{0, long}, long},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := pausingProvider(t, tc.keepAlive, tc.parts, tc.pauses)
			up, req := tc.adapter(t, srv.URL)
			out, err := up.Stream(context.Background(), req, nil)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			switch {
			case tc.wantAtLeast == 0 && out.MaxTokenGap != 0:
				t.Fatalf("MaxTokenGap %v, want none measured", out.MaxTokenGap)
			case out.MaxTokenGap < tc.wantAtLeast*3/4:
				t.Fatalf("MaxTokenGap %v, want about the longest pause %v (at least 3/4 of it)", out.MaxTokenGap, tc.wantAtLeast)
			}
		})
	}
}

func TestStallAfterFirstTokenDefaultsToTwoSecondsAndNegativeTurnsItOff(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: DefaultStallAfterFirstToken, -1: 0, time.Second: time.Second} {
		if got := (Options{StallAfterFirstToken: in}).stallAfter(); got != want {
			t.Errorf("StallAfterFirstToken %v: bound %v, want %v", in, got, want)
		}
	}
	if DefaultStallAfterFirstToken > 2*time.Second {
		t.Errorf("default stall bound %v, want at most 2s", DefaultStallAfterFirstToken)
	}
}

// policyBound calls its adapter with the stall bound in the context, as the
// worker does for an attempt whose policy names one.
type policyBound struct {
	Upstream
	bound time.Duration
}

func (p policyBound) Stream(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	return p.Upstream.Stream(WithStallAfterFirstToken(ctx, p.bound), req, sink)
}
