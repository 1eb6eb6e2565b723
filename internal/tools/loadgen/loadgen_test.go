package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPoissonGapsAreAPureFunctionOfTheSeed(t *testing.T) {
	a, err := PoissonGaps(1000, 100, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := PoissonGaps(1000, 100, 7)
	c, _ := PoissonGaps(1000, 100, 8)
	if !slices.Equal(a, b) {
		t.Error("two calls with one seed gave different gaps")
	}
	if slices.Equal(a, c) {
		t.Error("two seeds gave the same gaps")
	}
}

func TestPoissonGapsHaveTheMeanAndSpreadOfTheRate(t *testing.T) {
	const n, rate = 20_000, 100.0
	gaps, err := PoissonGaps(n, rate, 1)
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, g := range gaps {
		s := g.Seconds()
		sum += s
		sq += s * s
	}
	mean := sum / n
	sd := math.Sqrt(sq/n - mean*mean)
	// Exponential gaps: mean and standard deviation both 1/rate; 3% is
	// over four standard errors at this n.
	if math.Abs(mean*rate-1) > 0.03 || math.Abs(sd*rate-1) > 0.05 {
		t.Errorf("mean %.5f s, sd %.5f s; want both ≈ %.5f s", mean, sd, 1/rate)
	}
}

func TestPoissonGapsRejectsRatesThatAreNotPositiveAndFinite(t *testing.T) {
	for _, rate := range []float64{0, -1, math.Inf(1), math.NaN()} {
		if _, err := PoissonGaps(3, rate, 1); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("rate %v: err %v, want ErrInvalidOptions", rate, err)
		}
	}
}

// stepReader hands out one event per Read and moves the clock to the
// event's time first, as if each event arrived at that time.
type stepReader struct {
	events []timedEvent
	clock  *time.Duration
}

type timedEvent struct {
	at   time.Duration
	text string
}

func (r *stepReader) Read(p []byte) (int, error) {
	if len(r.events) == 0 {
		return 0, io.EOF
	}
	ev := r.events[0]
	*r.clock = ev.at
	n := copy(p, ev.text)
	if n < len(ev.text) {
		r.events[0].text = ev.text[n:]
	} else {
		r.events = r.events[1:]
	}
	return n, nil
}

func chunk(content string) string {
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", content)
}

func TestReadStreamParsesServerSentEvents(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name       string
		events     []timedEvent
		firstToken time.Duration
		chunks     int
		err        error
	}{
		{
			name: "first token is the first content, not the role chunk",
			events: []timedEvent{
				{5 * ms, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"},
				{12 * ms, chunk("Hel")},
				{15 * ms, chunk("lo")},
				{20 * ms, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"},
			},
			firstToken: 12 * ms, chunks: 2,
		},
		{
			name: "a tool call counts as a first token",
			events: []timedEvent{
				{3 * ms, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\"}]}}]}\n\n"},
				{4 * ms, "data: [DONE]\n\n"},
			},
			firstToken: 3 * ms, chunks: 1,
		},
		{
			name: "comments, other fields and CRLF line ends are skipped",
			events: []timedEvent{
				{1 * ms, ": keep-alive\r\n\r\nevent: message\r\nid: 1\r\n"},
				{2 * ms, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n"},
				{3 * ms, "data: [DONE]\r\n\r\n"},
			},
			firstToken: 2 * ms, chunks: 1,
		},
		{
			name: "data split over several lines is one event",
			events: []timedEvent{
				{7 * ms, "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n"},
				{8 * ms, "data:[DONE]"}, // no space, no blank line before EOF
			},
			firstToken: 7 * ms, chunks: 1,
		},
		{
			name: "an error event ends the stream with a StreamError",
			events: []timedEvent{
				{2 * ms, chunk("partial")},
				{9 * ms, "data: {\"error\":{\"message\":\"route failed\",\"type\":\"server_error\",\"code\":\"all_routes_failed\"}}\n\n"},
			},
			firstToken: 2 * ms, chunks: 1, err: &StreamError{Code: "all_routes_failed", Message: "route failed"},
		},
		{
			name:       "a stream without [DONE] is incomplete",
			events:     []timedEvent{{2 * ms, chunk("cut")}},
			firstToken: 2 * ms, chunks: 1, err: ErrIncomplete,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var clock time.Duration
			st, err := readStream(&stepReader{events: tt.events, clock: &clock}, func() time.Duration { return clock })
			if st.firstToken != tt.firstToken || st.chunks != tt.chunks {
				t.Errorf("first token %v after %d chunks, want %v after %d", st.firstToken, st.chunks, tt.firstToken, tt.chunks)
			}
			var se *StreamError
			switch want := tt.err.(type) {
			case nil:
				if err != nil || !st.done {
					t.Errorf("err %v, done %v; want a complete stream", err, st.done)
				}
			case *StreamError:
				if !errors.As(err, &se) || *se != *want {
					t.Errorf("err %v, want %v", err, want)
				}
			default:
				if !errors.Is(err, want) {
					t.Errorf("err %v, want %v", err, want)
				}
			}
		})
	}
}

// sseHandler streams a two-token answer; the hedge values go as headers or,
// with trailers set, as trailers after [DONE] (as the gateway does when it
// learns the commit late).
func sseHandler(trailers bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hedgerow-Operation") != "hedged" || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, `{"error":{"message":"missing headers","code":"bad"}}`, http.StatusBadRequest)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		if trailers {
			h.Set("Trailer", "X-Hedgerow-Attempts, X-Hedgerow-Hedged, X-Hedgerow-Winner-Route, X-Hedgerow-Gate")
		} else {
			setHedge(h)
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, chunk("a")+chunk("b")+"data: [DONE]\n\n")
		if trailers {
			setHedge(h)
		}
	}
}

func setHedge(h http.Header) {
	h.Set("X-Hedgerow-Attempts", "2")
	h.Set("X-Hedgerow-Hedged", "true")
	h.Set("X-Hedgerow-Winner-Route", "fake-1")
	h.Set("X-Hedgerow-Gate", "g-1/2/1")
}

func requests(n int) []Request {
	out := make([]Request, n)
	for i := range out {
		out[i] = Request{
			Body:   []byte(`{"model":"general","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
			Header: http.Header{"X-Hedgerow-Operation": {"hedged"}},
		}
	}
	return out
}

func TestRunReadsTheHedgeValuesFromHeadersOrTrailers(t *testing.T) {
	for _, trailers := range []bool{false, true} {
		t.Run(fmt.Sprintf("trailers=%v", trailers), func(t *testing.T) {
			srv := httptest.NewServer(sseHandler(trailers))
			defer srv.Close()
			var progressed []int
			var mu sync.Mutex
			sum, err := Run(context.Background(), Options{
				BaseURL: srv.URL, APIKey: "k", Requests: requests(5), Rate: 1e5, Seed: 1, Timeout: 10 * time.Second,
				Progress: func(r Result) { mu.Lock(); progressed = append(progressed, r.Index); mu.Unlock() },
			})
			if err != nil {
				t.Fatal(err)
			}
			if sum.Sent != 5 || len(progressed) != 5 {
				t.Fatalf("sent %d, progress told of %d; want 5 each", sum.Sent, len(progressed))
			}
			want := Hedge{Attempts: 2, Hedged: true, WinnerRoute: "fake-1", Gate: "g-1/2/1", FromTrailers: trailers}
			for _, r := range sum.Results {
				switch {
				case r.Err != nil || r.Status != http.StatusOK:
					t.Errorf("request %d: status %d, err %v", r.Index, r.Status, r.Err)
				case r.Hedge != want:
					t.Errorf("request %d: hedge %+v, want %+v", r.Index, r.Hedge, want)
				case r.Chunks != 2 || r.FirstToken <= 0 || r.FirstToken > r.Total || r.Sent < r.Due:
					t.Errorf("request %d: %d chunks, due %v, sent %v, first token %v, total %v", r.Index, r.Chunks, r.Due, r.Sent, r.FirstToken, r.Total)
				}
			}
		})
	}
}

func TestRunReportsErrorStatusesWithTheirCode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGatewayTimeout)
		_, _ = io.WriteString(w, `{"error":{"message":"deadline exceeded","type":"timeout_error","param":null,"code":"deadline_exceeded"}}`)
	}))
	defer srv.Close()
	sum, err := Run(context.Background(), Options{BaseURL: srv.URL, APIKey: "k", Requests: requests(1), Rate: 1e5, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var se *StatusError
	r := sum.Results[0]
	if !errors.As(r.Err, &se) || se.Status != http.StatusGatewayTimeout || se.Code != "deadline_exceeded" || r.FirstToken != 0 {
		t.Errorf("status %d, err %v, first token %v; want a 504 StatusError with code deadline_exceeded and no token", r.Status, r.Err, r.FirstToken)
	}
}

func TestRunSendsWithoutWaitingForEarlierResponses(t *testing.T) {
	// The first request is answered only once the second has arrived: a
	// closed loop would never send the second, and time out.
	second := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	arrived := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived++
		n := arrived
		mu.Unlock()
		if n == 1 {
			select {
			case <-second:
			case <-r.Context().Done():
				return
			}
		} else {
			once.Do(func() { close(second) })
		}
		sseHandler(false)(w, r)
	}))
	defer srv.Close()
	sum, err := Run(context.Background(), Options{BaseURL: srv.URL, APIKey: "k", Requests: requests(2), Rate: 1e5, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sum.Results {
		if r.Err != nil || r.CapDelayed {
			t.Errorf("request %d: err %v, cap delayed %v; want both answered, neither held back", r.Index, r.Err, r.CapDelayed)
		}
	}
}

func TestRunFlagsASendTheInFlightCapHeldBack(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		sseHandler(false)(w, r)
	}))
	defer srv.Close()
	var waited []int
	sum, err := Run(context.Background(), Options{
		BaseURL: srv.URL, APIKey: "k", Requests: requests(2), Rate: 1e5, Timeout: 10 * time.Second, MaxInFlight: 1,
		// Runs on the scheduler while request 0 holds the only slot.
		OnCapWait: func(i int) { waited = append(waited, i); close(release) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(waited, []int{1}) || sum.CapDelayed != 1 || sum.Results[0].CapDelayed || !sum.Results[1].CapDelayed {
		t.Errorf("waited for %v, cap delayed %d (%v, %v); want request 1 alone", waited, sum.CapDelayed,
			sum.Results[0].CapDelayed, sum.Results[1].CapDelayed)
	}
	if sum.Results[1].Sent < sum.Results[1].Due || sum.Results[1].Err != nil {
		t.Errorf("request 1: due %v, sent %v, err %v", sum.Results[1].Due, sum.Results[1].Sent, sum.Results[1].Err)
	}
}

func TestRunStopsSendingWhenCancelled(t *testing.T) {
	// Request 0 is never answered; the cap holds request 1 back, and the
	// run is cancelled right then.
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		// net/http notices a client going away only once the request body
		// has been read: without this, a request that reached the server
		// before the cancel held srv.Close forever.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sum, err := Run(ctx, Options{
		BaseURL: srv.URL, APIKey: "k", Requests: requests(50), Rate: 1e5, Timeout: 10 * time.Second, MaxInFlight: 1,
		OnCapWait: func(int) { cancel() },
	})
	if !errors.Is(err, context.Canceled) || sum == nil || sum.Sent >= 50 {
		t.Fatalf("err %v, summary %v; want a cancelled run that stopped early", err, sum)
	}
	for _, r := range sum.Results {
		if r.Err == nil || r.Status != 0 {
			t.Errorf("request %d: status %d, err %v; want every request failed without a response", r.Index, r.Status, r.Err)
		}
	}
}

func TestRunRejectsAnInvalidConfig(t *testing.T) {
	ok := Options{BaseURL: "http://127.0.0.1:1", Requests: requests(1), Rate: 1, Timeout: time.Second}
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"relative base URL", func(c *Options) { c.BaseURL = "/v1" }, "base URL"},
		{"no client deadline", func(c *Options) { c.Timeout = 0 }, "timeout"},
		{"negative cap", func(c *Options) { c.MaxInFlight = -1 }, "max in flight"},
		{"zero rate", func(c *Options) { c.Rate = 0 }, "rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			_, err := Run(context.Background(), c)
			if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want ErrInvalidOptions naming %q", err, tt.want)
			}
		})
	}
}
