package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.LeakOptions...) }

// wait bounds every wait for something the system under test does as soon
// as the test acts; reaching it is a failure.
const wait = 10 * time.Second

// calmModel is gpt4o without errors, stalls or hangs and with short
// answers, so every request succeeds quickly.
func calmModel(t *testing.T) *workload.Model {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(0.2, 0), Stall: workload.LogNormalMedian(0.2, 0)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(8)}
	return m
}

// fakeRoute serves simulator route n behind httptest, a model second lasting
// a real millisecond, and returns its base URL.
func fakeRoute(t *testing.T, n int) string {
	t.Helper()
	return fakeServer(t, n, calmModel(t), fakellm.Options{}) + "/v1"
}

// parse loads extra YAML after two routes to the given base URLs, a pool
// "general" over them and a quick default policy.
func parse(t *testing.T, urlA, urlB, extra string) *config.Config {
	t.Helper()
	y := configText(urlA, urlB, extra)
	cfg, err := config.Parse("node.yaml", []byte(y), config.RoleServe, os.LookupEnv)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// configText is the file parse loads.
func configText(urlA, urlB, extra string) string {
	return fmt.Sprintf(`nats:
  urls: [nats://127.0.0.1:4222]
http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m, labels: {region: a}}
  - {name: fake-b, provider: openai, base_url: %q, model: m, labels: {region: b}}
pools:
  general: {routes: [fake-a, fake-b]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
%s`, urlA, urlB, extra)
}

func stop(t *testing.T, s interface{ Stop(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// get fetches url with a client that keeps no idle connections, so no
// goroutine outlives the test.
func do(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	resp, body := send(t, req)
	return resp.StatusCode, body
}

// send is do with the whole response (its body read and closed).
func send(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

func TestServeAnswersAChatCompletionOverHTTP(t *testing.T) {
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), "")
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	if s.NATSURL() != "" {
		t.Errorf("NATSURL = %q, want empty: nats.listen is unset", s.NATSURL())
	}
	base := "http://" + s.HTTPAddr().String()
	if strings.HasSuffix(base, ":0") {
		t.Fatalf("HTTPAddr %s is not the bound address", base)
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	status, body := do(t, req)
	if status != http.StatusOK {
		t.Fatalf("chat completion: %d %s", status, body)
	}
	var completion struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &completion); err != nil {
		t.Fatalf("completion %s: %v", body, err)
	}
	if completion.Object != "chat.completion" || len(completion.Choices) != 1 || completion.Choices[0].Message.Content == "" {
		t.Fatalf("completion %s has no answer", body)
	}
	// The workers' and the dispatcher's metrics are served together. The
	// worker's in-flight gauge exists from its start; its attempt counter
	// is only bumped after the result is published, which can be after the
	// caller has its answer.
	status, metrics := get(t, base+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("metrics: %d", status)
	}
	for _, name := range []string{"hedgerow_groups_total", "hedgerow_worker_inflight"} {
		if !strings.Contains(string(metrics), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestServeListensForExternalWorkersWhenAsked(t *testing.T) {
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), "")
	users := localUsers(t, cfg)
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	wopts, err := users.Options(natsauth.UserWorker)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect([]string{s.NATSURL()}, "external-worker", nil, wopts...)
	if err != nil {
		t.Fatalf("connect to %q: %v", s.NATSURL(), err)
	}
	defer nc.Close()
	w, err := StartWorkers(cfg, nc, Options{Routes: []string{"fake-a"}, MetricsListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	defer stop(t, w)
	status, metrics := get(t, "http://"+w.MetricsAddr().String()+"/metrics")
	if status != http.StatusOK || !strings.Contains(string(metrics), "go_goroutines") {
		t.Fatalf("worker metrics: %d %.200s", status, metrics)
	}
	for _, probe := range []string{"/healthz", "/readyz"} {
		if status, body := get(t, "http://"+w.MetricsAddr().String()+probe); status != http.StatusOK || string(body) != "ok\n" {
			t.Errorf("worker %s while connected: %d %q", probe, status, body)
		}
	}
}

// A worker's readiness follows its NATS connection.
func TestWorkerProbesAnswer503WhileNotReady(t *testing.T) {
	for _, tc := range []struct {
		ready bool
		want  int
	}{{true, http.StatusOK}, {false, http.StatusServiceUnavailable}} {
		rec := httptest.NewRecorder()
		writeProbe(rec, tc.ready)
		if rec.Code != tc.want {
			t.Errorf("ready %v: %d, want %d", tc.ready, rec.Code, tc.want)
		}
	}
}

func TestGatewayRefusesToStart(t *testing.T) {
	tests := []struct {
		name       string
		extra      string
		maxPayload int64 // of the NATS server
		want       error
		mentions   string
	}{
		{"against a NATS server whose max_payload is below nats.max_payload", "", 1 << 20, ErrPayloadTooSmall,
			"the NATS server takes messages of up to 1MiB, nats.max_payload is 8MiB"},
		{"with redis and the default gate.on_unavailable, against a NATS server without JetStream", "redis", 16 << 20,
			jetstream.ErrJetStreamNotEnabled, "enable JetStream on the NATS servers, or set gate.on_unavailable to local or refuse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			extra := tt.extra
			if extra == "redis" {
				t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
				extra = "redis: {url: \"" + redistest.Start(t).URL() + "\", hash_key_env: NODE_TEST_HASH_KEY}\n"
			}
			cfg := parse(t, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", extra)
			nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(int32(tt.maxPayload))), nats.Name("gateway"))
			g, err := StartGateway(cfg, nc, nil, Options{})
			if !errors.Is(err, tt.want) {
				if g != nil {
					stop(t, g)
				}
				t.Fatalf("StartGateway: %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.mentions) {
				t.Errorf("error %q does not say %q", err, tt.mentions)
			}
		})
	}
}

func TestGatewayStartsAgainstALargeEnoughNATSServer(t *testing.T) {
	cfg := parse(t, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "")
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(16<<20)), nats.Name("gateway"))
	g, err := StartGateway(cfg, nc, nil, Options{})
	if err != nil {
		t.Fatalf("StartGateway: %v", err)
	}
	defer stop(t, g)
	if status, body := get(t, "http://"+g.Addr().String()+"/v1/models"); status != http.StatusOK || !strings.Contains(string(body), `"general"`) {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
}

// TestServeWithRedisKeepsItsBudgetsAndWinnersThere: with redis.url set the
// winner gate of every request lives in Redis, and so does the attempt
// ledger of a request with an Idempotency-Key, where another replica would
// find them; a request without one is this gateway's alone, and its ledger
// stays in the gateway's memory (docs/architecture.md §7 "Slices").
func TestServeWithRedisKeepsItsBudgetsAndWinnersThere(t *testing.T) {
	rs := redistest.Start(t)
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1),
		"redis: {url: \""+rs.URL()+"\", key_prefix: nodetest, hash_key_env: NODE_TEST_HASH_KEY}\n")
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	for _, idempotencyKey := range []string{"node-test-action", ""} {
		req, err := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr().String()+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if idempotencyKey != "" {
			req.Header.Set("Idempotency-Key", idempotencyKey)
		}
		if status, body := do(t, req); status != http.StatusOK {
			t.Fatalf("chat completion (Idempotency-Key %q): %d %s", idempotencyKey, status, body)
		}
	}
	keys, err := rs.Client().Keys(t.Context(), "nodetest:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ledgers, winners int
	for _, k := range keys {
		gateKey := strings.HasSuffix(k, ":win") || strings.HasSuffix(k, ":epoch")
		if strings.Contains(k, "{ua:") && !gateKey {
			ledgers++
		}
		if strings.HasSuffix(k, ":win") {
			winners++
		}
	}
	if ledgers != 1 || winners != 2 {
		t.Fatalf("redis keys %q: want one ledger (the keyed request's) and both winners", keys)
	}
	// The gate's ledger, on serve's own JetStream, holds the winners too.
	nc, err := s.nats.Connect("ledger-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), arbiter.DefaultLedgerBucket)
	if err != nil {
		t.Fatalf("the gate's ledger bucket: %v", err)
	}
	keys, err = kv.Keys(t.Context())
	if err != nil || len(keys) != 2 {
		t.Fatalf("ledger keys %q, %v; want the two user actions' winners", keys, err)
	}
	// The latency sketch of the request's cohort is shared too, at the
	// sketch syncer's next tick (one a second).
	eventually.True(t, wait, "a shared latency sketch in redis", func() bool {
		sketches, err := rs.Client().Keys(t.Context(), "nodetest:{sk:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(sketches) > 0
	})
}

func TestStartFailsOnAnAddressInUse(t *testing.T) {
	busy := httptest.NewServer(http.NotFoundHandler())
	defer busy.Close()
	addr := strings.TrimPrefix(busy.URL, "http://")
	cfg := parse(t, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "")
	cfg.HTTP.Listen = addr
	if s, err := StartServe(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "listen "+addr) {
		if s != nil {
			stop(t, s)
		}
		t.Fatalf("StartServe on a busy address: %v", err)
	}
	if f, err := StartFakeLLM(addr, fakellm.Options{Workload: workload.GPT4o}, nil); err == nil {
		stop(t, f)
		t.Fatal("StartFakeLLM on a busy address succeeded")
	}
}

func TestFakeLLMStopEndsHeldRequestsFirst(t *testing.T) {
	m := calmModel(t)
	m.TTFT = workload.TTFT{HangFraction: 1}
	f, err := StartFakeLLM("127.0.0.1:0", fakellm.Options{Model: m, Seed: 1, OnRecord: nil}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + f.Addr().String()
	if status, body := get(t, base+"/v1/models"); status != http.StatusOK || !strings.Contains(string(body), `"data"`) {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
	// A hung request holds its connection until the pinned deadline (30 s of
	// real time here); Stop must end it rather than wait for it.
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	waitInFlight(t, base)
	stop(t, f)
	select {
	case status := <-answered:
		if status != http.StatusServiceUnavailable {
			t.Errorf("held request answered %d, want 503", status)
		}
	case <-time.After(wait):
		t.Fatal("held request not ended by Stop")
	}
	http.DefaultClient.CloseIdleConnections()
}

// waitInFlight polls /stats until the fake holds a request: the request is
// sent by another goroutine and nothing else says when it arrived.
func waitInFlight(t *testing.T, base string) {
	t.Helper()
	eventually.True(t, wait, "the request to reach the fake", func() bool {
		_, body := get(t, base+"/stats?limit=1")
		var st fakellm.Stats
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("stats %s: %v", body, err)
		}
		return st.Totals.InFlight > 0
	})
}

// localUsers opens serve's NATS listener on a free loopback port with users
// generated for cfg's routes (serve refuses a listener without them).
func localUsers(t *testing.T, cfg *config.Config) *natsauth.Local {
	t.Helper()
	var routes []string
	for _, r := range cfg.Routes {
		routes = append(routes, r.Name)
	}
	l, err := natsauth.WriteLocal(t.TempDir(), routes, natsauth.ResponsesForConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.Listen = "127.0.0.1:0"
	cfg.NATS.ServerConfig, cfg.NATS.NKeySeedFile = l.ServerConfigPath(), l.SeedFile(natsauth.UserServe)
	return l
}
