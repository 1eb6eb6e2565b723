package natsdoor

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
)

// natsWait bounds every wait for something the front door does as soon as
// the test acts; reaching it is a failure.
const natsWait = 10 * time.Second

// startNATSService starts the front door of c's dispatcher on its own
// connection and stops it when the test ends (before the dispatcher closes).
func startNATSService(t *testing.T, c *cluster, opts NATSServiceOptions) *NATSService {
	t.Helper()
	s, err := StartNATSService(c.d, c.d.nc, opts)
	if err != nil {
		t.Fatalf("StartNATSService: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), natsWait)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
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

func TestNATSServiceAnswersPingAndListsItsEndpointInInfo(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 3}))
	startNATSService(t, c, NATSServiceOptions{})

	m, err := c.nc.Request("$SRV.PING."+schemas.SubmitServiceName, nil, natsWait)
	if err != nil {
		t.Fatalf("$SRV.PING.%s: %v", schemas.SubmitServiceName, err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != schemas.SubmitServiceName || ping.Type != micro.PingResponseType || ping.ID == "" {
		t.Fatalf("ping answer %s (%v), want the %s service's ping", m.Data, err, schemas.SubmitServiceName)
	}

	m, err = c.nc.Request("$SRV.INFO."+schemas.SubmitServiceName, nil, natsWait)
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
	if !ok || submit.QueueGroup != NATSQueueGroup {
		t.Errorf("info endpoints %+v: want %s in queue group %s", info.Endpoints, schemas.SubmitSubject, NATSQueueGroup)
	}
	if _, ok := endpoints[schemas.SubmitCancelPrefix+"*"]; !ok {
		t.Errorf("info endpoints %+v: want the cancel endpoint %s*", info.Endpoints, schemas.SubmitCancelPrefix)
	}
	if info.Version != NATSServiceVersion || info.Metadata["wire_version"] != strconv.Itoa(schemas.Version) {
		t.Errorf("info %+v: want version %s and wire_version %d", info, NATSServiceVersion, schemas.Version)
	}
}

func TestNATSSubmitAnswersOneSchemaValidResponse(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 4}))
	startNATSService(t, c, NATSServiceOptions{})

	m := request(t, c.nc, submitBody(t, false), nil)
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
	if g := c.groupRecord(resp.GroupID); g.Outcome != schemas.GroupCommitted {
		t.Errorf("group record %+v, want committed", g)
	}
}

func TestNATSStreamSendsTheChunksInOrderThenTheAnswer(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 12}))
	startNATSService(t, c, NATSServiceOptions{})

	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, true)}); err != nil {
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
	c, _ := twoRoutes(t, newScript(behaviour{words: 2}))
	startNATSService(t, c, NATSServiceOptions{})
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
		{"a request id that is no subject token", valid, nats.Header{schemas.HeaderRequestID: {"a.b"}}, schemas.ErrInvalidRequest, 400,
			schemas.HeaderRequestID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := errorAnswer(t, request(t, c.nc, []byte(tc.data), tc.header), tc.code, tc.status)
			if !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
		})
	}
}

func TestNATSGroupErrorCarriesItsStableCodeAndGroup(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{hang: true}))
	startNATSService(t, c, NATSServiceOptions{})
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", DeadlineMs: 300, Request: chat(false)})
	if err != nil {
		t.Fatal(err)
	}
	m := request(t, c.nc, data, nil)
	errorAnswer(t, m, schemas.ErrDeadlineExceeded, 504)
	group := m.Header.Get(schemas.HeaderGroup)
	if group == "" {
		t.Fatalf("no %s header on a group's failure", schemas.HeaderGroup)
	}
	if g := c.groupRecord(group); g.Outcome != schemas.GroupFailed || g.ErrorCode != schemas.ErrDeadlineExceeded {
		t.Errorf("group record %+v, want failed with deadline_exceeded", g)
	}
}

func TestNATSCancelSubjectCancelsTheGroup(t *testing.T) {
	c, ps := twoRoutes(t, newScript(behaviour{hang: true}))
	startNATSService(t, c, NATSServiceOptions{})
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	const id = "cancel-me-1"
	if err := c.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox,
		Header: nats.Header{schemas.HeaderRequestID: {id}}, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	var hung *provider
	select {
	case r := <-ps["a"].arrived:
		hung = ps[r]
	case r := <-ps["b"].arrived:
		hung = ps[r]
	case <-time.After(natsWait):
		t.Fatal("the primary never reached a provider")
	}
	if err := c.nc.Publish(schemas.SubmitCancelSubject(id), nil); err != nil {
		t.Fatal(err)
	}
	waitGone(t, hung)
	deadline := time.After(natsWait)
	for {
		select {
		case g := <-c.groups:
			if g.Outcome == schemas.GroupFailed && g.ErrorCode == schemas.ErrCanceled {
				return
			}
			t.Fatalf("group record %+v, want failed with canceled", g)
		case <-deadline:
			t.Fatal("no group record after the cancel")
		}
	}
}

func TestNATSCancelThatOvertakesItsRequestRunsNoGroup(t *testing.T) {
	ps := map[string]*provider{"a": newProvider(t, "a", newScript(behaviour{words: 2})), "b": newProvider(t, "b", newScript(behaviour{words: 2}))}
	c := newCluster(t, []string{"a", "b"}, ps, "")
	s := startNATSService(t, c, NATSServiceOptions{})
	const id = "early-cancel"
	if err := c.nc.Publish(schemas.SubmitCancelSubject(id), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancel to be remembered", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.canceled[id]
		return ok
	})
	if err := c.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: c.nc.NewInbox(),
		Header: nats.Header{schemas.HeaderRequestID: {id}}, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to meet its cancel", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.canceled[id]
		return !ok
	})
	// Admission turned the request away before any group existed, so no
	// attempt can reach a provider later.
	if n := len(ps["a"].arrived) + len(ps["b"].arrived); n != 0 {
		t.Fatalf("%d attempts reached a provider for a request cancelled before it arrived", n)
	}
	s.mu.Lock()
	inflight := s.inflight
	s.mu.Unlock()
	if inflight != 0 {
		t.Fatalf("%d requests in flight, want none", inflight)
	}
}

func TestNATSStreamWhoseCallerLeftIsCancelled(t *testing.T) {
	// Route "x" has no real worker: the fake one commits the stream at its
	// first chunk, then streams a chunk every few milliseconds until it is
	// cancelled, as a provider does.
	c := newCluster(t, []string{"x"}, nil, "")
	cancelled := make(chan schemas.Cancel, 1)
	startFakeWorker(t, c, []string{"x"}, func(fw *fakeWorker, a schemas.Attempt) {
		fw.accept(a)
		fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		give := time.After(natsWait)
		for seq := int64(1); ; seq++ {
			fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: seq, Delta: "word ", Tokens: 1, CumulativeTokens: seq, First: seq == 1})
			select {
			case <-tick.C:
				continue
			case cancel := <-fw.cancels:
				fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusCanceled,
					ErrorScope: schemas.ScopeTransient, LastSeq: seq, CancellationObserved: true, Usage: schemas.Usage{OutputUnits: seq}})
				cancelled <- cancel
			case <-give:
			}
			return
		}
	})
	startNATSService(t, c, NATSServiceOptions{})
	caller := connect(t, c.ns)
	inbox := caller.NewInbox()
	sub, err := caller.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, true)}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(natsWait)
	if err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusChunk {
		t.Fatalf("first message %v (%v), want a chunk", m, err)
	}
	// The caller goes away without a word: its inbox has no subscriber, so
	// the next chunk comes back to the gateway as "no responders".
	caller.Close()
	select {
	case cancel := <-cancelled:
		if cancel.Reason != schemas.CancelCallerGone {
			t.Fatalf("cancel %+v, want reason %s", cancel, schemas.CancelCallerGone)
		}
	case <-time.After(natsWait):
		t.Fatal("the attempt of a stream whose caller left was never cancelled")
	}
}

func TestNATSServiceAtItsLimitAnswersUnavailableAtOnce(t *testing.T) {
	c, ps := twoRoutes(t, newScript(behaviour{hang: true}))
	startNATSService(t, c, NATSServiceOptions{MaxInFlight: 1})
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", DeadlineMs: 2000, Request: chat(false)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: data}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ps["a"].arrived:
	case <-ps["b"].arrived:
	case <-time.After(natsWait):
		t.Fatal("the first request never reached a provider")
	}
	msg := errorAnswer(t, request(t, c.nc, submitBody(t, false), nil), schemas.ErrUnavailable, 503)
	if !strings.Contains(msg, "limit of 1") {
		t.Errorf("message %q does not name the limit", msg)
	}
	// The first request still ends, at its deadline.
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatal(err)
	}
	errorAnswer(t, m, schemas.ErrDeadlineExceeded, 504)
}

func TestNATSServiceStopAnswersWhatIsInFlightThenUnregisters(t *testing.T) {
	c, ps := twoRoutes(t, newScript(behaviour{firstByte: 300 * time.Millisecond, words: 2}))
	s, err := StartNATSService(c.d, c.d.nc, NATSServiceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ps["a"].arrived:
	case <-ps["b"].arrived:
	case <-time.After(natsWait):
		t.Fatal("the request never reached a provider")
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
	m, err := sub.NextMsg(natsWait)
	if err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("in-flight request's answer %v (%v), want done", m, err)
	}
	wg.Wait()
	if stopErr != nil {
		t.Fatalf("Stop: %v", stopErr)
	}
	if _, err := c.nc.Request(schemas.SubmitSubject, submitBody(t, false), natsWait); err != nats.ErrNoResponders {
		t.Fatalf("request after Stop: %v, want no responders", err)
	}
}

// waitFor polls cond until it holds, failing the test after natsWait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(natsWait)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
