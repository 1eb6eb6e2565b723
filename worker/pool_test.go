package worker_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
	"github.com/hedgerow/hedgerow/worker"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// poolWait bounds every wait for something the pool does as soon as the test
// acts; reaching it is a failure.
const poolWait = 10 * time.Second

// fakeRoute is a simulator route behind httptest that remembers the
// Authorization header of every chat request and the x-api-key header of
// every Messages request.
type fakeRoute struct {
	url string

	mu      sync.Mutex
	auths   []string
	apiKeys []string
}

func (f *fakeRoute) xAPIKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.apiKeys)
}

func (f *fakeRoute) authorizations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.auths)
}

// startFakeRoute plays route n of a calm gpt4o (no errors, stalls or hangs;
// a model second is a real millisecond).
func startFakeRoute(t *testing.T, n int) *fakeRoute {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(0.1, 0), Stall: workload.LogNormalMedian(0.1, 0)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(5)}
	fake, err := fakellm.New(fakellm.Options{Model: m, Seed: 1, TimeScale: 0.001, Route: n})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRoute{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		switch r.URL.Path {
		case "/v1/chat/completions":
			f.auths = append(f.auths, r.Header.Get("Authorization"))
		case "/v1/messages":
			f.apiKeys = append(f.apiKeys, r.Header.Get("X-Api-Key"))
		}
		f.mu.Unlock()
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		fake.Close()
		srv.Close()
	})
	f.url = srv.URL + "/v1"
	return f
}

// env is a fake process environment.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// parse loads routes (YAML list items) and a pool over them, for the serve
// role with every key variable set, so the pool's own checks are what a
// test exercises, and returns them as a worker process passes them to
// StartWorkers.
func parse(t *testing.T, routes ...string) []worker.Route {
	t.Helper()
	var names []string
	for _, r := range routes {
		names = append(names, strings.Split(strings.TrimPrefix(r, "{name: "), ",")[0])
	}
	y := "routes:\n  - " + strings.Join(routes, "\n  - ") +
		"\npools:\n  general: {routes: [" + strings.Join(names, ", ") + "]}\n"
	cfg, err := config.Parse("pool.yaml", []byte(y), config.RoleServe,
		env(map[string]string{"ROUTE_KEY": "k", "OTHER_KEY": "k"}))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return node.WorkerRoutes(cfg)
}

// run sends a non-streaming attempt on route and returns its result.
func run(t *testing.T, nc *nats.Conn, route string) *schemas.AttemptResult {
	t.Helper()
	att := schemas.Attempt{
		GroupID: "g_" + route, UserActionID: "ua_pool", Attempt: 1, Role: schemas.RolePrimary, Route: route,
		OperationClass: "default", ModelClass: "general",
		DeadlineUnixMs: time.Now().Add(poolWait).UnixMilli(), RemainingMs: poolWait.Milliseconds(),
		CommitPoint: schemas.FirstToken, ReplyInbox: nc.NewInbox(),
		Request: schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hi")}}},
	}
	sub, err := nc.SubscribeSync(att.ReplyInbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	data, err := att.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(schemas.AttemptSubject(route), data); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := sub.NextMsg(poolWait)
		if err != nil {
			t.Fatalf("route %s: no result: %v", route, err)
		}
		r, err := schemas.DecodeReply(msg.Data)
		if err != nil {
			t.Fatalf("route %s: reply %s: %v", route, msg.Data, err)
		}
		if res, ok := r.(*schemas.AttemptResult); ok {
			return res
		}
	}
}

func stopPool(t *testing.T, p *worker.Workers) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), poolWait)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func TestPoolRunsOneWorkerPerRouteWithItsOwnKey(t *testing.T) {
	a, b := startFakeRoute(t, 0), startFakeRoute(t, 1)
	cfg := parse(t,
		fmt.Sprintf("{name: keyed, provider: openai, base_url: %q, model: m, api_key_env: ROUTE_KEY}", a.url),
		fmt.Sprintf("{name: open, provider: openai, base_url: %q, model: m}", b.url))
	nc := natstest.Connect(t, natstest.Start(t))
	metrics := worker.NewMetrics()
	p, err := worker.StartWorkers(cfg, nc, worker.WorkersOptions{LookupEnv: env(map[string]string{"ROUTE_KEY": "sk-route"}), Metrics: metrics})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	defer stopPool(t, p)
	if got := p.Routes(); !slices.Equal(got, []string{"keyed", "open"}) {
		t.Fatalf("Routes = %v, want [keyed open]", got)
	}
	for _, route := range p.Routes() {
		if res := run(t, nc, route); res.StatusClass != schemas.StatusOK || res.Content == "" {
			t.Errorf("route %s: result %+v, want a successful answer", route, res)
		}
	}
	if got := a.authorizations(); !slices.Equal(got, []string{"Bearer sk-route"}) {
		t.Errorf("keyed route saw Authorization %q, want the key from ROUTE_KEY", got)
	}
	if got := b.authorizations(); !slices.Equal(got, []string{""}) {
		t.Errorf("route without api_key_env saw Authorization %q, want none", got)
	}
}

func TestPoolServesAnthropicRoutesWithTheKeyInXAPIKey(t *testing.T) {
	a := startFakeRoute(t, 0)
	cfg := parse(t, fmt.Sprintf("{name: claude, provider: anthropic, base_url: %q, model: m, api_key_env: ROUTE_KEY}",
		strings.TrimSuffix(a.url, "/v1")))
	nc := natstest.Connect(t, natstest.Start(t))
	p, err := worker.StartWorkers(cfg, nc, worker.WorkersOptions{LookupEnv: env(map[string]string{"ROUTE_KEY": "sk-ant-route"})})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	defer stopPool(t, p)
	res := run(t, nc, "claude")
	if res.StatusClass != schemas.StatusOK || res.Content == "" || res.FinishReason != "stop" || res.Usage.Estimated || res.Usage.OutputUnits < 1 {
		t.Errorf("result %+v, want a complete answer with the provider's usage", res)
	}
	if got := a.xAPIKeys(); !slices.Equal(got, []string{"sk-ant-route"}) {
		t.Errorf("Messages requests carried x-api-key %q, want the key from ROUTE_KEY", got)
	}
	if got := a.authorizations(); len(got) != 0 {
		t.Errorf("chat completions requests %q reached an anthropic route", got)
	}
}

func TestPoolServesOnlyTheRoutesAskedFor(t *testing.T) {
	a := startFakeRoute(t, 0)
	cfg := parse(t,
		fmt.Sprintf("{name: ra, provider: openai, base_url: %q, model: m}", a.url),
		"{name: rb, provider: openai, base_url: \"http://127.0.0.1:1/v1\", model: m}")
	nc := natstest.Connect(t, natstest.Start(t))
	p, err := worker.StartWorkers(cfg, nc, worker.WorkersOptions{LookupEnv: env(nil), Routes: []string{"ra", "ra"}})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	defer stopPool(t, p)
	if got := p.Routes(); !slices.Equal(got, []string{"ra"}) {
		t.Fatalf("Routes = %v, want [ra]", got)
	}
	if _, err := nc.Request(schemas.AttemptSubject("rb"), []byte("{}"), poolWait); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("request on the route left out: %v, want no responders", err)
	}
}

func TestPoolRefusesRoutesItCannotServe(t *testing.T) {
	const url = "http://127.0.0.1:1/v1"
	tests := []struct {
		name   string
		route  string
		env    map[string]string
		routes []string
		want   error
		// mentions is what the error must name for an operator to act on it.
		mentions string
	}{
		{"api_key_env unset", fmt.Sprintf("{name: r, provider: openai, base_url: %q, model: m, api_key_env: ROUTE_KEY}", url),
			map[string]string{"OTHER_KEY": "k"}, nil, worker.ErrMissingAPIKey, "route r: provider API key not set: environment variable ROUTE_KEY"},
		{"api_key_env set but empty", fmt.Sprintf("{name: r, provider: openai, base_url: %q, model: m, api_key_env: ROUTE_KEY}", url),
			map[string]string{"ROUTE_KEY": ""}, nil, worker.ErrMissingAPIKey, "ROUTE_KEY"},
		{"anthropic api_key_env unset", fmt.Sprintf("{name: r, provider: anthropic, base_url: %q, model: m, api_key_env: ROUTE_KEY}", url),
			nil, nil, worker.ErrMissingAPIKey, "route r: provider API key not set: environment variable ROUTE_KEY"},
		{"route not configured", fmt.Sprintf("{name: r, provider: openai, base_url: %q, model: m}", url),
			nil, []string{"r", "nope"}, worker.ErrUnknownRoute, `route "nope"`},
	}
	nc := natstest.Connect(t, natstest.Start(t))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := parse(t, tt.route)
			p, err := worker.StartWorkers(cfg, nc, worker.WorkersOptions{LookupEnv: env(tt.env), Routes: tt.routes})
			if !errors.Is(err, tt.want) {
				if p != nil {
					stopPool(t, p)
				}
				t.Fatalf("StartWorkers: %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.mentions) {
				t.Errorf("error %q does not say %q", err, tt.mentions)
			}
			// Nothing may be left subscribed after a refusal.
			if _, err := nc.Request(schemas.AttemptSubject("r"), []byte("{}"), poolWait); !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("after a refused start: %v, want no responders", err)
			}
		})
	}
}

// A route's continuation (routes[].continuation) reaches its worker's
// adapter, which refuses at start a style its provider does not speak.
func TestPoolGivesEachRouteItsContinuationStyle(t *testing.T) {
	const url = "http://127.0.0.1:1/v1"
	routes := parse(t,
		fmt.Sprintf("{name: vllm, provider: openai, base_url: %q, model: m, continuation: continue_final_message}", url),
		fmt.Sprintf("{name: claude, provider: anthropic, base_url: %q, model: m, continuation: prefill}", url),
		fmt.Sprintf("{name: plain, provider: openai, base_url: %q, model: m}", url))
	want := []upstream.ContinuationStyle{upstream.ContinueFinalMessage, upstream.ContinuePrefill, upstream.ContinueNone}
	for i, r := range routes {
		if r.Continuation != want[i] {
			t.Errorf("route %s: continuation %q, want %q", r.Name, r.Continuation, want[i])
		}
	}
	nc := natstest.Connect(t, natstest.Start(t))
	p, err := worker.StartWorkers(routes, nc, worker.WorkersOptions{LookupEnv: env(nil)})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	stopPool(t, p)

	bad := []worker.Route{{Name: "r", Provider: worker.ProviderOpenAI, BaseURL: url, Model: "m", Continuation: upstream.ContinuePrefill}}
	if p, err := worker.StartWorkers(bad, nc, worker.WorkersOptions{LookupEnv: env(nil)}); err == nil || !strings.Contains(err.Error(), `route r: upstream: openai adapter: continuation "prefill"`) {
		if p != nil {
			stopPool(t, p)
		}
		t.Fatalf("StartWorkers of an openai route with prefill: %v, want a refusal naming the route and its continuation", err)
	}
}
