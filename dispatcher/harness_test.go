package dispatcher

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// behaviour is what a scripted provider does with one request.
type behaviour struct {
	firstByte time.Duration // wait before the first byte
	hang      bool          // never answer; hold until the client goes away
	openEarly bool          // open the stream at once, as real providers do: firstByte and hang then delay the first token
	words     int           // content tokens, one per chunk
	status    int           // non-200: answer this error at once
	content   string        // when set, the whole answer, in one chunk
	empty     bool          // answer no content at all (0 completion tokens)
	finish    string        // finish reason; empty means "stop"
	stall     bool          // after its words, send only keep-alives until the client goes away
	hold      chan struct{} // when set, hold the request until it is closed (or the client goes away)
	reset     bool          // reset the connection (TCP RST) without answering
	html      bool          // answer 200 with an HTML page (text/html), as a proxy's error page does
}

// script hands out behaviours in request order, across every provider that
// shares it, then its default.
type script struct {
	mu   sync.Mutex
	next []behaviour
	dflt behaviour
	// every > 0 makes every every-th request after next behave as everyBehaviour.
	every          int
	everyBehaviour behaviour
	// cycle, when set, replaces dflt: requests after next take its
	// behaviours in turn.
	cycle []behaviour
	taken int
}

func newScript(dflt behaviour, next ...behaviour) *script { return &script{dflt: dflt, next: next} }

func (s *script) take() behaviour {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.next) == 0 {
		s.taken++
		if s.every > 0 && s.taken%s.every == 0 {
			return s.everyBehaviour
		}
		if len(s.cycle) > 0 {
			return s.cycle[s.taken%len(s.cycle)]
		}
		return s.dflt
	}
	b := s.next[0]
	s.next = s.next[1:]
	return b
}

// provider is a real OpenAI-compatible HTTP server, or an Anthropic
// Messages one, whose answers a script decides; it reports every request
// whose client went away.
type provider struct {
	srv       *httptest.Server
	script    *script
	anthropic bool        // speaks the Messages API, not chat completions
	arrived   chan string // the route of every request, as it arrives
	bodies    chan []byte // the body of every request, as it arrives
	gone      chan string // the route of a request whose client disconnected
	route     string
}

func newProvider(t *testing.T, route string, sc *script) *provider {
	p := &provider{script: sc, arrived: make(chan string, 1024), bodies: make(chan []byte, 64), gone: make(chan string, 64), route: route}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

// newMessagesProvider is a provider of the Anthropic Messages API.
func newMessagesProvider(t *testing.T, route string, sc *script) *provider {
	p := &provider{script: sc, anthropic: true, arrived: make(chan string, 1024), bodies: make(chan []byte, 64), gone: make(chan string, 64), route: route}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serveMessages))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	// Read the request as a provider does: net/http notices a client going
	// away only once the body has been consumed.
	p.keepBody(r)
	notify(p.arrived, p.route)
	b := p.script.take()
	if b.reset {
		resetConn(w)
		return
	}
	if b.html {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<html><body><h1>Service temporarily unavailable</h1></body></html>")
		return
	}
	if b.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		if b.status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(b.status)
		fmt.Fprintf(w, `{"error":{"message":"scripted","type":"server_error","code":null}}`)
		return
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-r.Context().Done():
			notify(p.gone, p.route)
			return false
		}
	}
	if b.openEarly {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n: keep-alive\n\n")
		w.(http.Flusher).Flush()
	}
	if b.hang {
		<-r.Context().Done()
		notify(p.gone, p.route)
		return
	}
	if b.hold != nil {
		select {
		case <-b.hold:
		case <-r.Context().Done():
			notify(p.gone, p.route)
			return
		}
	}
	if !wait(b.firstByte) {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	chunk := func(delta, finish string) {
		fr := "null"
		if finish != "" {
			fr = `"` + finish + `"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", delta, fr)
		fl.Flush()
	}
	words := max(b.words, 1)
	switch {
	case b.empty:
		words = 0
	case b.content != "":
		chunk(b.content, "")
	default:
		for i := range words {
			chunk(fmt.Sprintf("%s%d ", p.route, i), "")
		}
	}
	if b.stall {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				fmt.Fprint(w, ": keep-alive\n\n")
				fl.Flush()
			case <-r.Context().Done():
				notify(p.gone, p.route)
				return
			}
		}
	}
	chunk("", cmp.Or(b.finish, "stop"))
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", words, words+10)
	fl.Flush()
}

// resetConn closes the request's connection with a TCP reset, as a
// crashing upstream or a middlebox does.
func resetConn(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST instead of FIN
	}
	_ = conn.Close()
}

// keepBody reads the request's body and reports it on bodies; a full
// channel means nobody is reading bodies this many.
func (p *provider) keepBody(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	select {
	case p.bodies <- b:
	default:
	}
}

// pushbackSeconds is the Retry-After of a scripted Anthropic 429 or 529:
// long enough that no test outlives it.
const pushbackSeconds = "30"

// serveMessages answers as Anthropic's Messages API does.
func (p *provider) serveMessages(w http.ResponseWriter, r *http.Request) {
	p.keepBody(r)
	if r.URL.Path != "/v1/messages" {
		http.NotFound(w, r)
		return
	}
	notify(p.arrived, p.route)
	b := p.script.take()
	if b.status != 0 {
		typ := map[int]string{400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error"}[b.status]
		if b.status == 429 || b.status == 529 {
			w.Header().Set("Retry-After", pushbackSeconds)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(b.status)
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":"scripted"}}`, typ)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	ev := func(name, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		fl.Flush()
	}
	opening := func() {
		ev("message_start", `{"type":"message_start","message":{"id":"msg_x","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		ev("ping", `{"type":"ping"}`)
	}
	if b.openEarly {
		opening()
	}
	if b.hang {
		<-r.Context().Done()
		notify(p.gone, p.route)
		return
	}
	t := time.NewTimer(b.firstByte)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		notify(p.gone, p.route)
		return
	}
	words := max(b.words, 1)
	if !b.openEarly {
		opening()
	}
	for i := range words {
		ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s%d "}}`, p.route, i))
	}
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, words))
	ev("message_stop", `{"type":"message_stop"}`)
}

// cluster is an in-process hedgerow: a NATS server, workers per route and a
// dispatcher, all on loopback.
type cluster struct {
	t       *testing.T
	ns      *server.Server
	nc      *nats.Conn
	d       *Dispatcher
	workers []*worker.Worker
	records chan schemas.AttemptRecord
	groups  chan schemas.GroupRecord
	cfg     *config.Config
	// workerMetrics are the collectors every worker of the cluster counts on.
	workerMetrics *worker.Metrics
}

// withConfig fills base's routes, pools, policies and tenants from a loaded
// configuration, as a gateway does.
func withConfig(base Options, cfg *config.Config) Options {
	for _, r := range cfg.Routes {
		dl := schemas.DialectOpenAI
		if r.Provider == config.ProviderAnthropic {
			dl = schemas.DialectAnthropic
		}
		base.Routes = append(base.Routes, route.Route{Name: r.Name, Labels: r.Labels, Dialect: dl})
		if !r.Limits.IsZero() {
			if base.RouteLimits == nil {
				base.RouteLimits = map[string]RouteLimits{}
			}
			base.RouteLimits[r.Name] = RouteLimits{RequestsPerMinute: r.Limits.RequestsPerMinute, TokensPerMinute: r.Limits.TokensPerMinute}
		}
	}
	base.Pools = make(map[string]Pool, len(cfg.Pools))
	for name, p := range cfg.Pools {
		base.Pools[name] = Pool{Routes: p.Routes, Models: p.Models, QueueWait: p.QueueWait, Health: p.OutlierDetection.Health(), Contract: arbiter.ContractSpec{
			RequireComplete: p.Contract.RequireComplete, AllowEmpty: p.Contract.AllowEmpty,
			AllowTruncated: p.Contract.AllowTruncated, AllowContentFilter: p.Contract.AllowContentFilter,
			MaxOutputTokens: p.Contract.MaxOutputTokens,
			RequiredFields:  p.Contract.RequiredFields, JSONSchema: p.Contract.JSONSchema.Document}}
	}
	base.Policies, base.Tenants = cfg.Policies, cfg.Tenants
	return base
}

// addDispatcher starts another dispatcher replica on the cluster's NATS
// with the cluster's configuration and base's store, gate and registry.
func (c *cluster) addDispatcher(base Options) *Dispatcher {
	c.t.Helper()
	base.Conn, base.Logger = natstest.Connect(c.t, c.ns), testLogger()
	d, err := New(withConfig(base, c.cfg))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			c.t.Errorf("dispatcher close: %v", err)
		}
	})
	return d
}

// natsPayload is the max payload of the tests' NATS server: the
// configuration's default nats.max_payload, which the gateway checks.
const natsPayload = 8 << 20

// policyYAML is a test policy: a short known hedge delay (the estimator is
// kept cold), no control groups, and quick timeouts.
const policyYAML = `
policies:
  default:
    control_fraction: 0
    delay: {initial: 100ms, min: 10ms, warmup_samples: 1000000}
    deadline: 3s
    min_useful_time: 50ms
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
    duplicate_rate: {ceiling: 1}
`

// newCluster starts NATS, one worker per provider (routes without a provider
// get no worker) and a dispatcher with pool "general" over routes. Extra YAML
// with its own policies replaces policyYAML.
func newCluster(t *testing.T, routes []string, providers map[string]*provider, extraYAML string) *cluster {
	t.Helper()
	return newClusterWithPool(t, routes, providers, "", extraYAML)
}

// newClusterWithPool is newCluster with more keys of pool "general"
// (models, contract), as YAML indented by four spaces.
func newClusterWithPool(t *testing.T, routes []string, providers map[string]*provider, poolYAML, extraYAML string) *cluster {
	t.Helper()
	return newClusterWith(t, clusterOptions{routes: routes, providers: providers, poolYAML: poolYAML, extraYAML: extraYAML})
}

// clusterOptions are newClusterWith's: newClusterWithPool's arguments, and
// the in-flight limit of every route's worker (0: the default).
type clusterOptions struct {
	routes              []string
	providers           map[string]*provider
	poolYAML, extraYAML string
	maxInflight         int
	// limits are routes' limits as YAML flow mappings, by route
	// (e.g. "{requests_per_minute: 60}").
	limits map[string]string
	// region is the deployment's region of the cluster's dispatcher and
	// workers, whose wire they use (schemas.RegionWire); empty: none.
	region string
}

func newClusterWith(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	routes, providers, poolYAML, extraYAML := o.routes, o.providers, o.poolYAML, o.extraYAML
	ns := natstest.Start(t, natstest.MaxPayload(natsPayload), natstest.JetStream(t.TempDir()))
	c := &cluster{t: t, ns: ns, nc: natstest.Connect(t, ns),
		records: make(chan schemas.AttemptRecord, 1024), groups: make(chan schemas.GroupRecord, 1024),
		workerMetrics: worker.NewMetrics()}
	var y strings.Builder
	y.WriteString("routes:\n")
	for _, r := range routes {
		kind, url := "openai", "http://127.0.0.1:1/v1"
		if p := providers[r]; p != nil {
			url = p.srv.URL + "/v1"
			if p.anthropic {
				kind, url = "anthropic", p.srv.URL
			}
		}
		limit := ""
		if o.maxInflight > 0 {
			limit = fmt.Sprintf(", max_inflight: %d", o.maxInflight)
		}
		if l := o.limits[r]; l != "" {
			limit += ", limits: " + l
		}
		fmt.Fprintf(&y, "  - {name: %s, provider: %s, base_url: %q, model: m, labels: {provider: %s}%s}\n", r, kind, url, r, limit)
	}
	fmt.Fprintf(&y, "pools:\n  general:\n    routes: [%s]\n", strings.Join(routes, ", "))
	y.WriteString(poolYAML)
	if !strings.Contains(extraYAML, "policies:") {
		y.WriteString(policyYAML)
	}
	y.WriteString(extraYAML)
	cfg, err := config.Parse("test.yaml", []byte(y.String()), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y.String())
	}
	for _, r := range cfg.Routes {
		p := providers[r.Name]
		if p == nil {
			continue
		}
		var up upstream.Upstream
		var err error
		if p.anthropic {
			up, err = upstream.NewAnthropic(upstream.AnthropicOptions{Options: upstream.Options{BaseURL: r.BaseURL, Model: r.Model}})
		} else {
			up, err = upstream.NewOpenAI(upstream.Options{BaseURL: r.BaseURL, Model: r.Model})
		}
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Options{Route: r.Name, Upstream: up, Conn: natstest.Connect(t, ns), HeartbeatInterval: 50 * time.Millisecond,
			MaxInflight: r.MaxInflight, Logger: testLogger(), Metrics: c.workerMetrics, Region: o.region})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		c.workers = append(c.workers, w)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.Stop(ctx)
		})
	}
	c.cfg = cfg
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.d = c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Region: o.region})
	sub := func(subject string, f func([]byte)) {
		s, err := c.nc.Subscribe(subject, func(m *nats.Msg) { f(m.Data) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Unsubscribe() })
	}
	wire := schemas.RegionWire(o.region)
	sub(wire.AttemptRecordSubject(), func(b []byte) {
		var r schemas.AttemptRecord
		if json.Unmarshal(b, &r) == nil {
			select {
			case c.records <- r:
			default: // nobody is reading records this many
			}
		}
	})
	sub(wire.GroupRecordSubject(), func(b []byte) {
		var r schemas.GroupRecord
		if json.Unmarshal(b, &r) == nil {
			select {
			case c.groups <- r:
			default:
			}
		}
	})
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func chat(stream bool) schemas.ChatRequest {
	return schemas.ChatRequest{Messages: []schemas.Message{{Role: "user", Content: json.RawMessage(`"hello"`)}}, Stream: stream, MaxTokens: 50}
}

// groupRecord waits for the group record of group id.
func (c *cluster) groupRecord(id string) schemas.GroupRecord {
	c.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-c.groups:
			if r.HedgeGroupID == id {
				return r
			}
		case <-timeout:
			c.t.Fatalf("no group record for %s", id)
		}
	}
}

// attemptRecords waits for n dispatcher records of group id.
func (c *cluster) attemptRecords(id string, n int) map[int]schemas.AttemptRecord {
	c.t.Helper()
	out := map[int]schemas.AttemptRecord{}
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case r := <-c.records:
			if r.HedgeGroupID == id && r.Reporter == schemas.ReporterDispatcher {
				out[r.Attempt] = r
			}
		case <-timeout:
			c.t.Fatalf("got %d of %d attempt records for %s", len(out), n, id)
		}
	}
	return out
}

// notify records an event for tests that wait on it; a full channel means
// nobody is waiting for that many, so the rest are dropped.
func notify(ch chan string, route string) {
	select {
	case ch <- route:
	default:
	}
}

func waitArrived(t *testing.T, p *provider) {
	t.Helper()
	select {
	case <-p.arrived:
	case <-time.After(10 * time.Second):
		t.Fatalf("no request reached the %s provider", p.route)
	}
}

func waitGone(t *testing.T, p *provider) {
	t.Helper()
	select {
	case <-p.gone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s provider's connection was never closed", p.route)
	}
}

// testLogger logs to stderr when HEDGEROW_TEST_LOG is set, else nowhere.
func testLogger() *slog.Logger {
	if os.Getenv("HEDGEROW_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fakeWorker plays the worker side of the wire for some routes, so a test can
// make an attempt misbehave in ways a real worker does not: answer Busy,
// never accept, stop its heartbeats, or finish after it was cancelled.
type fakeWorker struct {
	t       *testing.T
	nc      *nats.Conn
	inbox   string
	cancels chan schemas.Cancel
}

// startFakeWorker serves routes with handle, called once per attempt on its
// own goroutine.
func startFakeWorker(t *testing.T, c *cluster, routes []string, handle func(fw *fakeWorker, a schemas.Attempt)) *fakeWorker {
	t.Helper()
	fw := &fakeWorker{t: t, nc: natstest.Connect(t, c.ns), inbox: nats.NewInbox(), cancels: make(chan schemas.Cancel, 16)}
	cs, err := fw.nc.Subscribe(fw.inbox, func(m *nats.Msg) {
		var cancel schemas.Cancel
		if schemas.Decode(m.Data, &cancel) == nil {
			fw.cancels <- cancel
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, r := range routes {
		s, err := fw.nc.QueueSubscribe(schemas.AttemptSubjectPrefix+r, "hedgerow-worker-"+r, func(m *nats.Msg) {
			var a schemas.Attempt
			if schemas.Decode(m.Data, &a) != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); handle(fw, a) }()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Unsubscribe() })
	}
	if err := fw.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wg.Wait(); _ = cs.Unsubscribe() })
	return fw
}

// fakeWorkerID names the fake worker in the replies it sends.
const fakeWorkerID = "fake"

// send publishes msg on a's reply inbox as a worker does: naming itself and
// returning the attempt's secret (stamped here, so tests build replies by
// what they say).
func (fw *fakeWorker) send(a schemas.Attempt, msg any) {
	msg = stamp(msg, fakeWorkerID, a.Secret)
	data, err := json.Marshal(msg)
	if err != nil {
		fw.t.Error(err)
		return
	}
	_ = fw.nc.Publish(a.ReplyInbox, data)
}

// stamp returns reply msg naming worker and carrying secret, where the
// message leaves them empty.
func stamp(msg any, worker, secret string) any {
	set := func(w, s *string) {
		if *w == "" {
			*w = worker
		}
		if *s == "" {
			*s = secret
		}
	}
	switch m := msg.(type) {
	case schemas.Accept:
		set(&m.WorkerID, &m.Secret)
		return m
	case schemas.Busy:
		set(&m.WorkerID, &m.Secret)
		return m
	case schemas.Heartbeat:
		set(&m.WorkerID, &m.Secret)
		return m
	case schemas.FirstByte:
		set(&m.WorkerID, &m.Secret)
		return m
	case schemas.Chunk:
		set(&m.WorkerID, &m.Secret)
		return m
	case schemas.AttemptResult:
		set(&m.WorkerID, &m.Secret)
		return m
	}
	return msg
}

func (fw *fakeWorker) accept(a schemas.Attempt) {
	fw.send(a, schemas.Accept{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: fakeWorkerID, ControlInbox: fw.inbox})
}

// answer accepts and completes an attempt at once with a valid answer.
func (fw *fakeWorker) answer(a schemas.Attempt, content string) {
	fw.accept(a)
	fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
	fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusOK,
		ErrorScope: schemas.ScopeNone, FinishReason: "stop", Content: content, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 3}})
}
