package natsdoor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// natsWait bounds every wait for something the front door does as soon as
// the test acts; reaching it is a failure.
const natsWait = 10 * time.Second

// door is a NATS front door in front of a scripted submitter, on an
// embedded NATS server, with a connection for the test to call it on.
type door struct {
	svc *Service
	sub *frontdoortest.Submitter
	nc  *nats.Conn // the caller's connection
	url string     // the server, for more callers
}

// startDoor starts the front door of a scripted submitter, set up further
// by each of setup before it serves, and stops it when the test ends.
func startDoor(t *testing.T, script frontdoortest.Script, opts Options, setup ...func(*frontdoortest.Submitter)) *door {
	t.Helper()
	ns := natstest.Start(t)
	d := &door{sub: frontdoortest.New(script), nc: natstest.Connect(t, ns), url: ns.ClientURL()}
	for _, f := range setup {
		f(d.sub)
	}
	var err error
	if d.svc, err = Start(d.sub, natstest.Connect(t, ns), opts); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), natsWait)
		defer cancel()
		if err := d.svc.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return d
}

func chat(stream bool) schemas.ChatRequest {
	return schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hello")}}, MaxTokens: 50, Stream: stream}
}

// submitBody encodes a submit request to pool "general".
func submitBody(t *testing.T, stream bool) []byte {
	t.Helper()
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", Request: chat(stream)})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// request sends data on hedgerow.submit with the headers given and waits
// for the one answer.
func request(t *testing.T, nc *nats.Conn, data []byte, header nats.Header) *nats.Msg {
	t.Helper()
	m, err := nc.RequestMsg(&nats.Msg{Subject: schemas.SubmitSubject, Header: header, Data: data}, natsWait)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	return m
}

// errorAnswer checks that m is an error answer with code and status and
// returns its message.
func errorAnswer(t *testing.T, m *nats.Msg, code schemas.ErrorCode, status int) string {
	t.Helper()
	if got := m.Header.Get(schemas.HeaderStatus); got != schemas.StatusError {
		t.Fatalf("%s = %q (body %s), want %q", schemas.HeaderStatus, got, m.Data, schemas.StatusError)
	}
	if got := m.Header.Get(schemas.HeaderErrorCode); got != string(code) {
		t.Errorf("%s = %q, want %q", schemas.HeaderErrorCode, got, code)
	}
	if got := m.Header.Get(micro.ErrorCodeHeader); got != strconv.Itoa(status) {
		t.Errorf("%s = %q, want %d", micro.ErrorCodeHeader, got, status)
	}
	var body schemas.SubmitError
	if err := json.Unmarshal(m.Data, &body); err != nil || body.Code != code || body.Message == "" {
		t.Errorf("body %s (%v), want a SubmitError with code %s and a message", m.Data, err, code)
	}
	if m.Header.Get(micro.ErrorHeader) != body.Message {
		t.Errorf("%s = %q, body message %q: want the same", micro.ErrorHeader, m.Header.Get(micro.ErrorHeader), body.Message)
	}
	return body.Message
}

// blockUntil is a script that reports each submission on arrived, then
// waits for release (or its caller leaving) and ends with the result of
// answer.
func blockUntil(arrived chan<- struct{}, release <-chan struct{}, answer frontdoortest.Script) frontdoortest.Script {
	return func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return answer(ctx, sub, sink)
	}
}

func TestNATSServiceAnswersPingAndListsItsEndpointInInfo(t *testing.T) {
	d := startDoor(t, nil, Options{DispatcherID: "d-1"})

	m, err := d.nc.Request("$SRV.PING."+schemas.SubmitServiceName, nil, natsWait)
	if err != nil {
		t.Fatalf("$SRV.PING.%s: %v", schemas.SubmitServiceName, err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != schemas.SubmitServiceName || ping.Type != micro.PingResponseType || ping.ID == "" {
		t.Fatalf("ping answer %s (%v), want the %s service's ping", m.Data, err, schemas.SubmitServiceName)
	}

	m, err = d.nc.Request("$SRV.INFO."+schemas.SubmitServiceName, nil, natsWait)
	if err != nil {
		t.Fatalf("$SRV.INFO.%s: %v", schemas.SubmitServiceName, err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatalf("info answer %s: %v", m.Data, err)
	}
	endpoints := map[string]micro.EndpointInfo{}
	for _, e := range info.Endpoints {
		endpoints[e.Subject] = e
	}
	submit, ok := endpoints[schemas.SubmitSubject]
	if !ok || submit.QueueGroup != schemas.SubmitQueueGroup {
		t.Errorf("info endpoints %+v: want %s in queue group %s", info.Endpoints, schemas.SubmitSubject, schemas.SubmitQueueGroup)
	}
	if _, ok := endpoints[schemas.SubmitCancelPrefix+">"]; !ok {
		t.Errorf("info endpoints %+v: want the cancel endpoint %s>", info.Endpoints, schemas.SubmitCancelPrefix)
	}
	if info.Version != ServiceVersion || info.Metadata["wire_version"] != strconv.Itoa(schemas.Version) || info.Metadata["dispatcher"] != "d-1" {
		t.Errorf("info %+v: want version %s, wire_version %d and dispatcher d-1", info, ServiceVersion, schemas.Version)
	}
}

func TestNATSSubmitAnswersOneSchemaValidResponse(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{
		UserActionID: "ua-1", GroupID: "g-1", Content: "a0 a1 a2 a3 ", FinishReason: "stop",
		Usage: schemas.Usage{InputUnits: 10, OutputUnits: 4}, Attempts: 1, Winner: 1, WinnerRoute: "a", Gate: "g-1/1/1",
	}, false), Options{Tenant: "nats-callers"})

	m := request(t, d.nc, submitBody(t, false), nil)
	if got := m.Header.Get(schemas.HeaderStatus); got != schemas.StatusDone {
		t.Fatalf("%s = %q (%s), want %q", schemas.HeaderStatus, got, m.Data, schemas.StatusDone)
	}
	if err := schemas.Validate(schemas.KindSubmitResponse, m.Data); err != nil {
		t.Fatalf("answer does not match its schema: %v\n%s", err, m.Data)
	}
	var resp schemas.SubmitResponse
	if err := schemas.Decode(m.Data, &resp); err != nil {
		t.Fatal(err)
	}
	want := resp.WinnerRoute + "0 " + resp.WinnerRoute + "1 " + resp.WinnerRoute + "2 " + resp.WinnerRoute + "3 "
	if resp.Content != want || resp.Attempts != 1 || resp.WinnerAttempt != 1 || resp.Gate == nil || resp.Gate.GroupID != resp.GroupID {
		t.Fatalf("response %+v, want the primary's answer %q", resp, want)
	}
	subs := d.sub.Submissions()
	if len(subs) != 1 || subs[0].Pool != "general" || subs[0].Operation != "default" || subs[0].Tenant != "nats-callers" || subs[0].Request.Stream {
		t.Fatalf("submissions %+v", subs)
	}
}

func TestNATSStreamSendsTheChunksInOrderThenTheAnswer(t *testing.T) {
	var deltas []dispatcher.Delta
	for i := range 12 {
		deltas = append(deltas, dispatcher.Delta{Content: "b" + strconv.Itoa(i) + " "})
	}
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{
		UserActionID: "ua-1", GroupID: "g-1", FinishReason: "stop", Attempts: 2, Hedged: true, Winner: 2, WinnerRoute: "b", Gate: "g-1/2/1",
	}, true, deltas...), Options{})

	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, true)}); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	seq := int64(0)
	for {
		m, err := sub.NextMsg(natsWait)
		if err != nil {
			t.Fatalf("after chunk %d: %v", seq, err)
		}
		status := m.Header.Get(schemas.HeaderStatus)
		if status == schemas.StatusChunk {
			if err := schemas.Validate(schemas.KindSubmitChunk, m.Data); err != nil {
				t.Fatalf("chunk does not match its schema: %v\n%s", err, m.Data)
			}
			var ch schemas.SubmitChunk
			if err := schemas.Decode(m.Data, &ch); err != nil {
				t.Fatal(err)
			}
			if ch.Seq != seq+1 {
				t.Fatalf("chunk %d after chunk %d", ch.Seq, seq)
			}
			seq = ch.Seq
			text.WriteString(ch.Delta)
			continue
		}
		if status != schemas.StatusDone {
			t.Fatalf("final message %s = %q (%s), want %q", schemas.HeaderStatus, status, m.Data, schemas.StatusDone)
		}
		if err := schemas.Validate(schemas.KindSubmitResponse, m.Data); err != nil {
			t.Fatalf("answer does not match its schema: %v\n%s", err, m.Data)
		}
		var resp schemas.SubmitResponse
		if err := schemas.Decode(m.Data, &resp); err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for i := range 12 {
			want.WriteString(resp.WinnerRoute + strconv.Itoa(i) + " ")
		}
		if text.String() != want.String() {
			t.Fatalf("streamed %q, want the winner's words in order %q", text.String(), want.String())
		}
		if resp.Content != "" {
			t.Errorf("final answer repeats the content %q the chunks carried", resp.Content)
		}
		return
	}
}

func TestNATSBadInputIsAnsweredWithAMicroErrorNamingTheProblem(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{})
	valid := string(submitBody(t, false))
	for _, tc := range []struct {
		name    string
		data    string
		header  nats.Header
		code    schemas.ErrorCode
		status  int
		mention string
	}{
		{"not JSON", "{not json", nil, schemas.ErrInvalidRequest, 400, "version-1"},
		{"a future major version", strings.Replace(valid, `"v":1`, `"v":2`, 1), nil, schemas.ErrInvalidRequest, 400, "v=2"},
		{"no version", strings.Replace(valid, `"v":1,`, ``, 1), nil, schemas.ErrInvalidRequest, 400, "version"},
		{"no messages", `{"v":1,"operation_class":"default","model_class":"general","request":{"messages":[]}}`, nil,
			schemas.ErrInvalidRequest, 400, "submit_request schema"},
		{"an unknown field", strings.Replace(valid, `"v":1,`, `"v":1,"priority":9,`, 1), nil, schemas.ErrInvalidRequest, 400, "priority"},
		{"an unknown model class", strings.Replace(valid, `"general"`, `"gpt-9"`, 1), nil, schemas.ErrUnknownModel, 404, "gpt-9"},
		{"an unknown operation class", strings.Replace(valid, `"default"`, `"nightly-batch"`, 1), nil, schemas.ErrInvalidRequest, 400, "operation_class"},
		{"a response schema that does not compile", strings.Replace(valid, `"messages":`, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"objekt"}}},"messages":`, 1), nil,
			schemas.ErrInvalidRequest, 400, "response_format"},
		{"a schema bomb 1600 levels deep", strings.Replace(valid, `"messages":`, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":`+
			strings.Repeat(`{"properties":{"a":`, 1600)+`{}`+strings.Repeat(`}}`, 1600)+`}},"messages":`, 1), nil,
			schemas.ErrInvalidRequest, 400, "over the limits"},
		{"a max_tokens of 2^63-1", strings.Replace(valid, `"max_tokens":50`, `"max_tokens":9223372036854775807`, 1), nil,
			schemas.ErrInvalidRequest, 400, "max_tokens"},
		{"an embeddings request, which only the HTTP door serves",
			`{"v":1,"operation_class":"default","model_class":"general","request":{"embedding":{"input":["a"]}}}`, nil,
			schemas.ErrInvalidRequest, 400, "POST /v1/embeddings"},
		{"a request id that is no subject token", valid, nats.Header{schemas.HeaderRequestID: {"a.b"}}, schemas.ErrInvalidRequest, 400,
			schemas.HeaderRequestID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := errorAnswer(t, request(t, d.nc, []byte(tc.data), tc.header), tc.code, tc.status)
			if !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
		})
	}
}

func TestNATSGroupErrorCarriesItsStableCodeAndGroup(t *testing.T) {
	d := startDoor(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		if sub.IdempotencyKey == "retry" {
			return nil, &dispatcher.GroupError{Group: "g-8", Code: schemas.ErrAlreadyCommitted, Holder: "g-1/2/3"}
		}
		return nil, &dispatcher.GroupError{Group: "g-7", Code: schemas.ErrDeadlineExceeded}
	}, Options{})
	m := request(t, d.nc, submitBody(t, false), nil)
	errorAnswer(t, m, schemas.ErrDeadlineExceeded, 504)
	if group := m.Header.Get(schemas.HeaderGroup); group != "g-7" {
		t.Fatalf("%s = %q on a group's failure, want its group g-7", schemas.HeaderGroup, group)
	}
	// A committed winner is named in the answer, so the caller can match it.
	retry, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", IdempotencyKey: "retry", Request: chat(false)})
	if err != nil {
		t.Fatal(err)
	}
	var body schemas.SubmitError
	m = request(t, d.nc, retry, nil)
	errorAnswer(t, m, schemas.ErrAlreadyCommitted, 409)
	if err := json.Unmarshal(m.Data, &body); err != nil || body.Winner == nil || *body.Winner != (schemas.GateValue{GroupID: "g-1", Attempt: 2, Epoch: 3}) {
		t.Fatalf("body %s (%v), want the winner g-1/2/3", m.Data, err)
	}
}

// anonymousID is a request id that may be its own cancel's only proof: 128
// bits as hex (docs/architecture.md §8, "Cancels belong to their caller").
const anonymousID = "0123456789abcdef0123456789abcdef"

func TestNATSCancelSubjectCancelsTheSubmissionAndAnswersCanceled(t *testing.T) {
	gone := make(chan struct{}, 1)
	arrived := make(chan struct{}, 1)
	d := startDoor(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		arrived <- struct{}{}
		return frontdoortest.Hold(gone)(ctx, sub, sink)
	}, Options{})
	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox,
		Header: nats.Header{schemas.HeaderRequestID: {anonymousID}}, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the request never reached the runtime")
	}
	if err := d.nc.Publish(schemas.SubmitCancelSubjectFor(inbox, anonymousID), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(natsWait):
		t.Fatal("the cancel never reached the submission")
	}
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatalf("no final answer to a cancelled request: %v", err)
	}
	errorAnswer(t, m, schemas.ErrCanceled, frontdoor.StatusClientClosedRequest)
}

func TestNATSCancelThatOvertakesItsRequestIsAnsweredCanceledAndRunsNoGroup(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{})
	s := d.svc
	if err := d.nc.Publish(schemas.SubmitCancelSubject(anonymousID), nil); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, natsWait, "the cancel to be remembered", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.early.total == 1
	})
	m := request(t, d.nc, submitBody(t, false), nats.Header{schemas.HeaderRequestID: {anonymousID}})
	errorAnswer(t, m, schemas.ErrCanceled, frontdoor.StatusClientClosedRequest)
	// Admission turned the request away before it reached the runtime.
	if n := len(d.sub.Submissions()); n != 0 {
		t.Fatalf("%d submissions reached the runtime for a request cancelled before it arrived", n)
	}
	s.mu.Lock()
	inflight, remembered := s.inflight, s.early.total
	s.mu.Unlock()
	if inflight != 0 || remembered != 0 {
		t.Fatalf("%d requests in flight and %d cancels remembered, want none: the cancel was spent", inflight, remembered)
	}
}

func TestNATSStreamWhoseCallerLeftIsCancelled(t *testing.T) {
	// The runtime commits the stream and sends a delta every few
	// milliseconds until its caller goes away, as a provider does.
	cancelled := make(chan error, 1)
	d := startDoor(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		give := time.After(natsWait)
		for {
			if err := sink.Delta(dispatcher.Delta{Content: "word "}); err != nil {
				cancelled <- err
				return nil, err
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				cancelled <- ctx.Err()
				return nil, ctx.Err()
			case <-give:
				return nil, errors.New("the caller never left")
			}
		}
	}, Options{})
	ns, err := nats.Connect(d.url)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	inbox := ns.NewInbox()
	sub, err := ns.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, true)}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(natsWait)
	if err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusChunk {
		t.Fatalf("first message %v (%v), want a chunk", m, err)
	}
	// The caller goes away without a word: its inbox has no subscriber, so
	// the next chunk comes back to the gateway as "no responders".
	ns.Close()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the submission ended with %v, want its context cancelled", err)
		}
	case <-time.After(natsWait):
		t.Fatal("the submission of a stream whose caller left was never cancelled")
	}
}

func TestNATSServiceAtItsLimitAnswersUnavailableAtOnce(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	d := startDoor(t, blockUntil(arrived, release, frontdoortest.Fail(&dispatcher.GroupError{Group: "g-1", Code: schemas.ErrDeadlineExceeded})),
		Options{MaxInFlight: 1})
	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the first request never reached the runtime")
	}
	msg := errorAnswer(t, request(t, d.nc, submitBody(t, false), nil), schemas.ErrUnavailable, 503)
	if !strings.Contains(msg, "limit of 1") {
		t.Errorf("message %q does not name the limit", msg)
	}
	// The first request still ends, with its own answer.
	close(release)
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatal(err)
	}
	errorAnswer(t, m, schemas.ErrDeadlineExceeded, 504)
}

func TestNATSServiceStopAnswersWhatIsInFlightThenUnregisters(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	ns := natstest.Start(t)
	nc := natstest.Connect(t, ns)
	s, err := Start(frontdoortest.New(blockUntil(arrived, release, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false))),
		natstest.Connect(t, ns), Options{})
	if err != nil {
		t.Fatal(err)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the request never reached the runtime")
	}
	var wg sync.WaitGroup
	var stopErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), natsWait)
		defer cancel()
		stopErr = s.Stop(ctx)
	}()
	// Stop unregisters first, then waits for what is in flight.
	eventually.True(t, natsWait, "the service to stop taking requests", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed
	})
	close(release)
	m, err := sub.NextMsg(natsWait)
	if err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("in-flight request's answer %v (%v), want done", m, err)
	}
	wg.Wait()
	if stopErr != nil {
		t.Fatalf("Stop: %v", stopErr)
	}
	if _, err := nc.Request(schemas.SubmitSubject, submitBody(t, false), natsWait); err != nats.ErrNoResponders {
		t.Fatalf("request after Stop: %v, want no responders", err)
	}
}

// TestEveryFailureHasTheSameStatusOverNATSAsOverHTTP runs every error the
// runtime can return through both doors: the NATS door's error code header
// carries the status the OpenAI HTTP door answers.
func TestEveryFailureHasTheSameStatusOverNATSAsOverHTTP(t *testing.T) {
	failures := []error{
		fmt.Errorf("%w: %q", dispatcher.ErrUnknownPool, "nope"),
		fmt.Errorf("%w: messages: empty", dispatcher.ErrBadRequest),
		dispatcher.ErrShuttingDown,
		errors.New("surprise"),
	}
	for _, code := range []schemas.ErrorCode{schemas.ErrDeadlineExceeded, schemas.ErrAlreadyCommitted, schemas.ErrInvalidRequest,
		schemas.ErrRouteFailed, schemas.ErrAllRoutesFailed, schemas.ErrNoRoute, schemas.ErrNoWorkers, schemas.ErrBudgetExhausted, schemas.ErrRateLimited, schemas.ErrOverloaded,
		schemas.ErrStreamInterrupted} {
		failures = append(failures, &dispatcher.GroupError{Group: "g-1", Code: code, Holder: "g-0/1/1"})
	}
	var current error
	var mu sync.Mutex
	script := func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		mu.Lock()
		defer mu.Unlock()
		return nil, current
	}
	d := startDoor(t, script, Options{})
	h, err := httpdoor.New(d.sub, httpdoor.Options{Pools: map[string][]string{"general": {"a"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, failure := range failures {
		t.Run(failure.Error(), func(t *testing.T) {
			mu.Lock()
			current = failure
			mu.Unlock()
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			m := request(t, d.nc, submitBody(t, false), nil)
			if got := m.Header.Get(micro.ErrorCodeHeader); got != strconv.Itoa(resp.StatusCode) {
				t.Fatalf("NATS status %s, HTTP status %d: want the same", got, resp.StatusCode)
			}
			f := frontdoor.FailureFor(failure)
			if got := m.Header.Get(schemas.HeaderErrorCode); got != string(f.WireCode()) {
				t.Fatalf("NATS code %q, want %q", got, f.WireCode())
			}
			// The retry hints are the HTTP door's too.
			if m.Header.Get(schemas.HeaderShouldRetry) != resp.Header.Get(frontdoor.HeaderShouldRetry) ||
				m.Header.Get(schemas.HeaderRetryAfter) != resp.Header.Get("Retry-After") || resp.Header.Get(frontdoor.HeaderShouldRetry) == "" {
				t.Fatalf("NATS retry hints %q, %q; HTTP %q, %q", m.Header.Get(schemas.HeaderShouldRetry), m.Header.Get(schemas.HeaderRetryAfter),
					resp.Header.Get(frontdoor.HeaderShouldRetry), resp.Header.Get("Retry-After"))
			}
		})
	}
}
