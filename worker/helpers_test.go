package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// testRoute is the route every test worker serves.
const testRoute = "fake-a"

// fastScale makes a model second a real millisecond.
const fastScale = 0.001

// wait bounds every wait for a message or record the system under test
// produces as soon as the test's action reaches it; reaching it is a
// failure, never a synchronization.
const wait = 10 * time.Second

// promptCanary is the prompt of every test attempt: it must never appear in
// a record, a log line or a metric.
const promptCanary = "PROMPT-CANARY-do-not-record-7f3a"

// model returns gpt4o without errors, stalls or hangs, with a fixed first
// byte (model seconds), answer length and decode speed, so a test knows what
// every request does. Hung attempts hold their connection for an hour of
// model time, longer than any test deadline.
func model(t *testing.T, ttftSeconds float64, outputTokens int, tokensPerSecond float64) *workload.Model {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT = workload.TTFT{
		Main:  workload.LogNormalMedian(ttftSeconds, 0),
		Stall: workload.LogNormalMedian(ttftSeconds, 0),
	}
	m.InputTokens = workload.LogNormal{Mu: math.Log(100)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(float64(outputTokens))}
	m.MaxOutputTokens = max(m.MaxOutputTokens, outputTokens)
	m.TokensPerSecond, m.ITLSigma = tokensPerSecond, 0
	return m
}

// provider is a fake LLM route behind httptest and the real OpenAI adapter.
type provider struct {
	fake     *fakellm.Server
	http     *httptest.Server
	upstream *upstream.OpenAI
	// records receives each finished request's record.
	records chan fakellm.Record
	// arrived receives once per chat request as it reaches the server.
	arrived chan struct{}
	// gate, when set, holds every chat request until it is closed.
	gate chan struct{}
	// closing releases held requests when the test ends.
	closing chan struct{}
}

func startProvider(t *testing.T, cfg fakellm.Options, gate chan struct{}) *provider {
	t.Helper()
	p := &provider{records: make(chan fakellm.Record, 64), arrived: make(chan struct{}, 64), gate: gate,
		closing: make(chan struct{})}
	cfg.OnRecord = func(r fakellm.Record) { p.records <- r }
	if cfg.TimeScale == 0 {
		cfg.TimeScale = fastScale
	}
	if cfg.HangCap == 0 {
		cfg.HangCap = time.Hour
	}
	fake, err := fakellm.New(cfg)
	if err != nil {
		t.Fatalf("fakellm.New: %v", err)
	}
	p.fake = fake
	p.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			p.arrived <- struct{}{}
			if p.gate != nil {
				select {
				case <-p.gate:
				case <-r.Context().Done():
				case <-p.closing:
				}
			}
		}
		fake.ServeHTTP(w, r)
	}))
	p.upstream = newAdapter(t, p.http.URL+"/v1")
	t.Cleanup(func() {
		close(p.closing)
		fake.Close()
		p.http.Close()
	})
	return p
}

func newAdapter(t *testing.T, baseURL string) *upstream.OpenAI {
	t.Helper()
	o, err := upstream.NewOpenAI(upstream.Options{BaseURL: baseURL, Model: "route-model"})
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	t.Cleanup(o.CloseIdleConnections)
	return o
}

// record waits for the provider's next finished request.
func (p *provider) record(t *testing.T) fakellm.Record {
	t.Helper()
	select {
	case r := <-p.records:
		return r
	case <-time.After(wait):
		t.Fatal("no request finished at the provider")
		return fakellm.Record{}
	}
}

// syncBuffer is a log sink safe for the worker's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// harness plays the dispatcher against one worker: dc is its connection,
// the worker has its own.
type harness struct {
	t       *testing.T
	nats    *server.Server
	dc      *nats.Conn
	w       *Worker
	prov    *provider
	metrics *Metrics
	logs    *syncBuffer
	events  *nats.Subscription
}

type setup struct {
	fake     fakellm.Options
	gate     chan struct{}
	upstream upstream.Upstream // overrides the provider's adapter
	config   func(*Options)
	noStart  bool
}

func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	h := &harness{t: t, nats: natstest.Start(t), metrics: NewMetrics(), logs: &syncBuffer{}}
	h.dc = natstest.Connect(t, h.nats)
	wc := natstest.Connect(t, h.nats)
	h.prov = startProvider(t, s.fake, s.gate)
	events, err := h.dc.SubscribeSync(schemas.AttemptRecordSubject)
	if err != nil {
		t.Fatal(err)
	}
	h.events = events
	if err := h.dc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := Options{
		Route:             testRoute,
		Upstream:          h.prov.upstream,
		Conn:              wc,
		WorkerID:          "worker-test-1",
		MaxInflight:       4,
		HeartbeatInterval: 5 * time.Millisecond,
		DrainGrace:        wait,
		Logger:            slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:           h.metrics,
		FingerprintKey:    []byte("test-fingerprint-key"),
	}
	if s.upstream != nil {
		cfg.Upstream = s.upstream
	}
	if s.config != nil {
		s.config(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.w = w
	if !s.noStart {
		if err := w.Start(); err != nil {
			t.Fatalf("Start: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := w.Stop(ctx); err != nil && !s.noStart {
			t.Errorf("Stop: %v", err)
		}
		logs := h.logs.String()
		if bytes.Contains([]byte(logs), []byte(promptCanary)) {
			t.Errorf("the prompt reached the logs:\n%s", logs)
		}
		if t.Failed() {
			t.Logf("worker logs:\n%s", logs)
		}
	})
	return h
}

// attempt returns a streaming attempt of a fresh group with a 30 s budget.
func (h *harness) attempt(group string) schemas.Attempt {
	now := time.Now()
	secret, err := schemas.NewAttemptSecret()
	if err != nil {
		h.t.Fatal(err)
	}
	return schemas.Attempt{
		Secret:  secret,
		GroupID: group, UserActionID: "ua_test", Attempt: 1, Role: schemas.RolePrimary, Route: testRoute,
		OperationClass: "chat", ModelClass: "general",
		DeadlineUnixMs: now.Add(30 * time.Second).UnixMilli(), RemainingMs: 30_000,
		CommitPoint: schemas.FirstToken, ReplyInbox: h.dc.NewInbox(),
		Request: schemas.ChatRequest{
			Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(promptCanary)}},
			Stream:   true,
		},
	}
}

// inbox is the dispatcher's end of one attempt's reply inbox.
type inbox struct {
	t      *testing.T
	sub    *nats.Subscription
	secret string // the attempt's: every reply must return it
	worker string // the worker's id: every reply must name it
}

// listen subscribes to an attempt's reply inbox.
func (h *harness) listen(att schemas.Attempt) *inbox {
	h.t.Helper()
	sub, err := h.dc.SubscribeSync(att.ReplyInbox)
	if err != nil {
		h.t.Fatal(err)
	}
	// The worker replies on its own connection: the server must know the
	// subscription before then.
	if err := h.dc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return &inbox{t: h.t, sub: sub, secret: att.Secret, worker: h.w.ID()}
}

// send publishes att on the route's attempt subject and returns its inbox.
func (h *harness) send(att schemas.Attempt) *inbox {
	h.t.Helper()
	in := h.listen(att)
	h.publish(schemas.AttemptSubject(testRoute), att)
	return in
}

func (h *harness) publish(subject string, m json.Marshaler) {
	h.t.Helper()
	data, err := m.MarshalJSON()
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.dc.Publish(subject, data); err != nil {
		h.t.Fatal(err)
	}
}

// cancel sends a Cancel, with the attempt's secret (which inbox.next
// checked the Accept returned), to the control inbox the Accept named.
func (h *harness) cancel(acc *schemas.Accept, reason schemas.CancelReason) {
	h.t.Helper()
	h.publish(acc.ControlInbox, schemas.Cancel{GroupID: acc.GroupID, Attempt: acc.Attempt, Reason: reason, Secret: acc.Secret})
}

var replyKinds = map[schemas.ReplyType]string{
	schemas.ReplyAccept: schemas.KindAccept, schemas.ReplyBusy: schemas.KindBusy,
	schemas.ReplyHeartbeat: schemas.KindHeartbeat, schemas.ReplyFirstByte: schemas.KindFirstByte,
	schemas.ReplyChunk: schemas.KindChunk, schemas.ReplyResult: schemas.KindAttemptResult,
}

// next returns the inbox's next message, checked against its JSON schema.
func (in *inbox) next() schemas.Reply {
	in.t.Helper()
	msg, err := in.sub.NextMsg(wait)
	if err != nil {
		in.t.Fatalf("no reply: %v", err)
	}
	r, err := schemas.DecodeReply(msg.Data)
	if err != nil {
		in.t.Fatalf("reply %s: %v", msg.Data, err)
	}
	if err := schemas.Validate(replyKinds[r.ReplyType()], msg.Data); err != nil {
		in.t.Fatalf("reply %s does not match its schema: %v", msg.Data, err)
	}
	if w, secret := r.Sender(); w != in.worker || secret != in.secret {
		in.t.Fatalf("%s names worker %q and returns the attempt's secret: %v; want %q and true",
			r.ReplyType(), w, secret == in.secret, in.worker)
	}
	return r
}

// accept returns the next reply, which must be an Accept.
func (in *inbox) accept() *schemas.Accept {
	in.t.Helper()
	r := in.next()
	acc, ok := r.(*schemas.Accept)
	if !ok {
		in.t.Fatalf("first reply is %s, want accept", r.ReplyType())
	}
	return acc
}

// untilResult returns every reply up to and including the AttemptResult.
func (in *inbox) untilResult() ([]schemas.Reply, *schemas.AttemptResult) {
	in.t.Helper()
	var rs []schemas.Reply
	for {
		r := in.next()
		rs = append(rs, r)
		if res, ok := r.(*schemas.AttemptResult); ok {
			return rs, res
		}
	}
}

// record returns the next attempt record the worker published, checked
// against its JSON schema and for the prompt.
func (h *harness) record() schemas.AttemptRecord {
	h.t.Helper()
	msg, err := h.events.NextMsg(wait)
	if err != nil {
		h.t.Fatalf("no attempt record: %v", err)
	}
	if err := schemas.Validate(schemas.KindAttemptRecord, msg.Data); err != nil {
		h.t.Fatalf("record %s does not match its schema: %v", msg.Data, err)
	}
	if bytes.Contains(msg.Data, []byte(promptCanary)) {
		h.t.Fatalf("record carries the prompt: %s", msg.Data)
	}
	var rec schemas.AttemptRecord
	if err := schemas.Decode(msg.Data, &rec); err != nil {
		h.t.Fatal(err)
	}
	return rec
}

// kinds lists the reply types of rs, for failure messages.
func kinds(rs []schemas.Reply) []schemas.ReplyType {
	out := make([]schemas.ReplyType, len(rs))
	for i, r := range rs {
		out[i] = r.ReplyType()
	}
	return out
}
