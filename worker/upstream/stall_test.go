package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
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
			o, err := NewOpenAI(Config{BaseURL: url + "/v1", Model: "m", StallAfterFirstToken: bound})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}, openAIChunk(openAIRoleChunk) + openAIChunk(`{"content":"Hello"}`), ": keep-alive\n\n", "Hello"},
		{"messages", func(t *testing.T, url string) Upstream {
			a, err := NewAnthropic(AnthropicConfig{Config: Config{BaseURL: url, Model: "m", StallAfterFirstToken: bound}})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}, messagesOpening + messagesText(0, "Hello"), sseEvent("ping", `{"type": "ping"}`), "Hello"},
		{"the policy's bound, carried by the context", func(t *testing.T, url string) Upstream {
			o, err := NewOpenAI(Config{BaseURL: url + "/v1", Model: "m", StallAfterFirstToken: time.Hour})
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
	o, err := NewOpenAI(Config{BaseURL: srv.URL + "/v1", Model: "m", StallAfterFirstToken: bound})
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

func TestStallAfterFirstTokenDefaultsToTwoSecondsAndNegativeTurnsItOff(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: DefaultStallAfterFirstToken, -1: 0, time.Second: time.Second} {
		if got := (Config{StallAfterFirstToken: in}).stallAfter(); got != want {
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
