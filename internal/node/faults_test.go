package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// faultRequests is how many requests each fault of
// TestAFaultyRouteOfThreeNeverCostsACallerItsAnswer sends (half of them
// streaming, four at a time); -faults.requests=20 is the full run whose
// figures docs/architecture.md §12 gives.
var faultRequests = flag.Int("faults.requests", 8, "requests per fault in the faulty-route run")

// healthyErrors is the share of the healthy routes' attempts that fail with
// a 5xx in the faulty-route run: none by default, so that the run is a test
// (with max_attempts 2, a request whose primary met the faulty route and
// whose replacement meets a healthy route's error fails, whatever the
// rules); -faults.healthy-errors=0.005 is gpt4o's own share, for figures.
var healthyErrors = flag.Float64("faults.healthy-errors", 0, "share of the healthy routes' attempts that fail in the faulty-route run")

// realisticRoute serves simulator route n of the gpt4o workload behind
// httptest at a tenth of its time (first bytes ~60 ms, stalls ~350 ms,
// answers 50–500 ms), its 5xx share set to errors.
func realisticRoute(t *testing.T, n int, errors float64) string {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = errors
	return fakeServer(t, n, m, fakellm.Options{TimeScale: 0.1}) + "/v1"
}

// providerFault is how the faulty route of the fault run misbehaves.
type providerFault string

const (
	fault500         providerFault = "500 at once"
	fault503         providerFault = "503 at once"
	fault429         providerFault = "429 at once"
	faultReset       providerFault = "connection reset"
	faultSilent      providerFault = "silent"
	faultSlowHeaders providerFault = "slow headers"
	faultStall       providerFault = "stall before the first token"
	faultHang        providerFault = "hang"
)

// faultyProvider is an OpenAI-compatible route that answers every request
// with its fault, never with an answer (slow headers answer, but only after
// 20 s). Closing it ends every request it holds.
func faultyProvider(t *testing.T, fault providerFault) string {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		stream := bytes.Contains(body, []byte(`"stream":true`))
		flush := func() { w.(http.Flusher).Flush() }
		hold := func(d time.Duration) bool {
			select {
			case <-done:
				return false
			case <-r.Context().Done():
				return false
			case <-time.After(d):
				return true
			}
		}
		switch fault {
		case fault500, fault503, fault429:
			code := map[providerFault]int{fault500: 500, fault503: 503, fault429: 429}[fault]
			if fault == fault429 {
				w.Header().Set("Retry-After", "2")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"message":"fault %d","type":"server_error"}}`, code)
		case faultReset:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		case faultSilent:
			hold(time.Hour)
		case faultSlowHeaders:
			if hold(20 * time.Second) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"late"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			}
		case faultStall, faultHang:
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
			} else {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
			}
			flush()
			for fault == faultHang && hold(200*time.Millisecond) {
				if stream {
					fmt.Fprint(w, ": keep-alive\n\n")
				} else {
					fmt.Fprint(w, " ")
				}
				flush()
			}
			hold(time.Hour)
		}
	}))
	srv.Start()
	t.Cleanup(func() {
		close(done)
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL + "/v1"
}

// faultRun is what one fault's requests met.
type faultRun struct {
	latencies []time.Duration
	failures  []string // status and body of each request not answered validly
}

// TestAFaultyRouteOfThreeNeverCostsACallerItsAnswer runs a fresh serve per
// fault in front of three routes, one of them faulty, and sends each fault's
// requests (half streaming, four at a time) from a cold gateway: every
// request must be answered validly by a healthy route (docs/architecture.md
// §4 rule 4, §7's reserve). The latencies are logged, not judged: they are
// figures, and this machine is shared.
func TestAFaultyRouteOfThreeNeverCostsACallerItsAnswer(t *testing.T) {
	faults := []providerFault{fault500, fault503, fault429, faultReset, faultSilent, faultSlowHeaders, faultStall, faultHang}
	var table strings.Builder
	fmt.Fprintf(&table, "%-30s %5s %8s %8s %8s\n", "fault", "ok", "p50", "p95", "max")
	for _, fault := range faults {
		t.Run(strings.ReplaceAll(string(fault), " ", "_"), func(t *testing.T) {
			run := runFault(t, fault, *faultRequests)
			lat := slices.Clone(run.latencies)
			slices.Sort(lat)
			q := func(p float64) time.Duration {
				if len(lat) == 0 {
					return 0
				}
				return lat[min(len(lat)-1, int(p*float64(len(lat))))]
			}
			fmt.Fprintf(&table, "%-30s %2d/%-2d %8v %8v %8v\n", fault, len(run.latencies)-len(run.failures), len(run.latencies),
				q(0.5).Round(time.Millisecond), q(0.95).Round(time.Millisecond), q(1).Round(time.Millisecond))
			for _, f := range run.failures {
				t.Errorf("%s: a request was not answered validly: %s", fault, f)
			}
		})
	}
	t.Logf("faulty route of three, %d requests per fault:\n%s", *faultRequests, table.String())
}

// runFault starts serve over two realistic routes and one with fault and sends n
// requests, four at a time, every other one streaming.
func runFault(t *testing.T, fault providerFault, n int) faultRun {
	t.Helper()
	y := fmt.Sprintf(`http:
  listen: 127.0.0.1:0
routes:
  - {name: faulty, provider: openai, base_url: %q, model: m, labels: {region: a}}
  - {name: healthy-b, provider: openai, base_url: %q, model: m, labels: {region: b}}
  - {name: healthy-c, provider: openai, base_url: %q, model: m, labels: {region: c}}
pools:
  gpt: {routes: [faulty, healthy-b, healthy-c]}
policies:
  default: {control_fraction: 0, deadline: 30s}
`, faultyProvider(t, fault), realisticRoute(t, 1, *healthyErrors), realisticRoute(t, 2, *healthyErrors))
	cfg, err := config.Parse("faults.yaml", []byte(y), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	url := "http://" + s.HTTPAddr().String() + "/v1/chat/completions"
	client := &http.Client{Timeout: 45 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var (
		mu  sync.Mutex
		run faultRun
		wg  sync.WaitGroup
	)
	slots := make(chan struct{}, 4)
	for i := range n {
		stream := i%2 == 1
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			start := time.Now()
			failure := askOnce(client, url, i, stream)
			mu.Lock()
			defer mu.Unlock()
			run.latencies = append(run.latencies, time.Since(start))
			if failure != "" {
				run.failures = append(run.failures, failure)
			}
		}()
	}
	wg.Wait()
	return run
}

// askOnce sends request i and says how it was not answered validly, or "".
func askOnce(client *http.Client, url string, i int, stream bool) string {
	// Each request its own question: the fake draws a request's latency
	// and errors from its messages, so equal requests would meet equal
	// draws on every route.
	body := fmt.Sprintf(`{"model":"gpt","max_tokens":16,"stream":%t,"messages":[{"role":"user","content":"question %d"}]}`, stream, i)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.StatusCode, raw)
	}
	if !stream {
		var answer struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &answer); err != nil || len(answer.Choices) == 0 || answer.Choices[0].Message.Content == "" {
			return fmt.Sprintf("200 without an answer: %s", raw)
		}
		return ""
	}
	var content strings.Builder
	done := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil || chunk.Error != nil {
			return fmt.Sprintf("stream event %s", data)
		}
		for _, c := range chunk.Choices {
			content.WriteString(c.Delta.Content)
		}
	}
	if !done || content.Len() == 0 {
		return fmt.Sprintf("stream without an answer (done %t): %s", done, raw)
	}
	return ""
}
