package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func TestPercentilesOfAreNearestRank(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var thousand []time.Duration
	for i := 1000; i >= 1; i-- { // unsorted on purpose
		thousand = append(thousand, ms(i))
	}
	tests := []struct {
		name string
		in   []time.Duration
		want Percentiles
	}{
		{"none", nil, Percentiles{}},
		{"one", []time.Duration{ms(7)}, Percentiles{P50: 7, P90: 7, P99: 7, P999: 7, Max: 7}},
		{"1..1000 ms", thousand, Percentiles{P50: 500, P90: 900, P99: 990, P999: 999, Max: 1000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PercentilesOf(tt.in); got != tt.want {
				t.Errorf("PercentilesOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// completionServer answers every chat request with a one-word completion
// and records the bodies and operation headers it saw.
type completionServer struct {
	*httptest.Server
	mu         sync.Mutex
	models     map[string]int
	operations map[string]int
}

func newCompletionServer(t *testing.T) *completionServer {
	s := &completionServer{models: map[string]int{}, operations: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
		}
		data, _ := io.ReadAll(r.Body)
		if json.Unmarshal(data, &body) != nil || body.MaxTokens != 7 || r.URL.Path != DefaultPath {
			http.Error(w, `{"error":{"message":"bad request","code":"bad"}}`, http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.models[body.Model]++
		s.operations[r.Header.Get("X-Hedgerow-Operation")]++
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestBenchComparesTheGatewayWithTheDirectRouteSideBySide(t *testing.T) {
	gateway, direct := newCompletionServer(t), newCompletionServer(t)
	const rate, duration = 400.0, 500 * time.Millisecond
	rep, err := Bench(context.Background(), BenchOptions{
		URL: gateway.URL, CompareDirect: direct.URL, DirectModel: "m-direct", Operation: "chat",
		MaxTokens: 7, Rate: rate, Duration: duration, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	total := int(math.Round(2 * rate * duration.Seconds()))
	if rep.Direct == nil || rep.Added == nil || rep.Gateway.Requests+rep.Direct.Requests != total {
		t.Fatalf("report %+v: want both targets and the added row, %d requests in all", rep, total)
	}
	// A fair seeded coin: each side gets half, within five standard deviations.
	if d := math.Abs(float64(rep.Gateway.Requests) - float64(total)/2); d > 5*math.Sqrt(float64(total)/4) {
		t.Errorf("gateway got %d of %d requests: the coin is not fair", rep.Gateway.Requests, total)
	}
	for _, tr := range []*TargetReport{&rep.Gateway, rep.Direct} {
		if tr.OK != tr.Requests || tr.Errors != 0 || tr.Latency.P50 <= 0 || tr.Latency.P50 > tr.Latency.P99 || tr.Latency.P99 > tr.Latency.Max {
			t.Errorf("%s: %+v, want every request answered and ordered percentiles", tr.Name, tr)
		}
	}
	if want := rep.Gateway.Latency.minus(rep.Direct.Latency); *rep.Added != want {
		t.Errorf("added %+v, want gateway minus direct %+v", *rep.Added, want)
	}
	gateway.mu.Lock()
	defer gateway.mu.Unlock()
	direct.mu.Lock()
	defer direct.mu.Unlock()
	if gateway.models[DefaultBenchModel] != rep.Gateway.Requests || gateway.operations["chat"] != rep.Gateway.Requests {
		t.Errorf("gateway saw models %v and operations %v, want %d of %q with operation chat", gateway.models, gateway.operations, rep.Gateway.Requests, DefaultBenchModel)
	}
	if direct.models["m-direct"] != rep.Direct.Requests || direct.operations[""] != rep.Direct.Requests {
		t.Errorf("direct route saw models %v and operations %v, want %d of m-direct with no operation", direct.models, direct.operations, rep.Direct.Requests)
	}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gateway", "direct", "added by the gateway", "p99.9 ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// startServe runs `hedgerow serve` (NATS on loopback) in front of one
// instant fake route answering 20 tokens, and returns it with the route's
// root URL.
//
// Its NATS listener admits the users returned (serve refuses it without).
func startServe(t testing.TB) (*node.Serve, string, *natsauth.Local) {
	t.Helper()
	model, err := fakellm.InstantModel(20)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakellm.New(fakellm.Options{Model: model, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { fake.Close(); srv.Close() })
	users, err := natsauth.WriteLocal(t.TempDir(), []string{"fake-a"}, natsauth.ResponsesFor(30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("nats:\n  listen: \"127.0.0.1:0\"\n"+users.ServeYAML()+"http: {listen: \"127.0.0.1:0\"}\n"+
		"routes:\n  - {name: fake-a, provider: openai, base_url: %q, model: m}\npools:\n  general: {routes: [fake-a]}\n"+
		// Timeouts a burst under -race on a busy machine cannot reach.
		"policies:\n  default: {accept_timeout: 5s, heartbeat_interval: 100ms, heartbeat_timeout: 5s}\n", srv.URL+"/v1")
	cfg, err := config.Parse("bench-test.yaml", []byte(y), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	s, err := node.StartServe(cfg, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop serve: %v", err)
		}
	})
	return s, srv.URL, users
}

func TestBenchOverNATSCountsAnswersAndErrorsByCode(t *testing.T) {
	s, _, users := startServe(t)
	nc, err := users.Connect(s.NATSURL(), natsauth.UserClient)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		model  string
		stream bool
		ok     bool
	}{
		{"answers", "general", false, true},
		{"streamed answers", "general", true, true},
		{"an unknown model", "gpt-9", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Bench(context.Background(), BenchOptions{NATS: c, NATSURL: s.NATSURL(), Model: tc.model, Stream: tc.stream,
				Rate: 200, Duration: 250 * time.Millisecond, Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			g := rep.Gateway
			if g.Requests != 50 || g.Via != "nats" || rep.Direct != nil {
				t.Fatalf("report %+v, want 50 requests over nats and no direct target", rep)
			}
			if tc.ok && (g.OK != g.Requests || g.Latency.P50 <= 0 || (tc.stream && (g.FirstToken == nil || g.FirstToken.P50 <= 0))) {
				t.Fatalf("gateway %+v, want every request answered, with first tokens for streams", g)
			}
			if !tc.ok && (g.OK != 0 || g.ErrorsByKind["unknown_model (404)"] != g.Requests) {
				t.Fatalf("gateway %+v, want every request failed with unknown_model (404)", g)
			}
		})
	}
}

func TestBenchRejectsOptionsItCannotRun(t *testing.T) {
	ok := BenchOptions{URL: "http://127.0.0.1:1", Rate: 1, Duration: time.Second}
	for _, tc := range []struct {
		name   string
		mutate func(*BenchOptions)
	}{
		{"no gateway", func(o *BenchOptions) { o.URL = "" }},
		{"two gateways", func(o *BenchOptions) { o.NATS = &client.Client{} }},
		{"zero rate", func(o *BenchOptions) { o.Rate = 0 }},
		{"no duration", func(o *BenchOptions) { o.Duration = 0 }},
		{"negative max tokens", func(o *BenchOptions) { o.MaxTokens = -1 }},
		{"a relative gateway URL", func(o *BenchOptions) { o.URL = "/v1" }},
		{"a relative direct URL", func(o *BenchOptions) { o.CompareDirect = "localhost" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.mutate(&o)
			if _, err := Bench(context.Background(), o); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("Bench = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

// A gateway that refuses every request for want of an API key stops the
// run at its first 401 — not after the whole warm-up and duration — with
// an error that says so.
func TestBenchStopsAtTheGatewaysFirst401(t *testing.T) {
	var count int64
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		count++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"message":"missing API key","type":"authentication_error","code":"invalid_api_key"}}`)
	}))
	defer srv.Close()
	start := time.Now()
	rep, err := Bench(context.Background(), BenchOptions{URL: srv.URL, Rate: 50, Duration: 30 * time.Second,
		Warmup: 10 * time.Second, Seed: 1, Timeout: 5 * time.Second})
	if !errors.Is(err, ErrUnauthorized) || rep != nil {
		t.Fatalf("Bench against a gateway that answers 401: report %v, error %v; want ErrUnauthorized", rep, err)
	}
	if !strings.Contains(err.Error(), "invalid_api_key") {
		t.Errorf("error %q does not name the gateway's code", err)
	}
	mu.Lock()
	n := count
	mu.Unlock()
	if took := time.Since(start); took > 10*time.Second || n > 100 {
		t.Errorf("Bench took %v and sent %d requests after a 401; want it to stop at once", took, n)
	}
}
