package dispatcher

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
)

// forgeryPolicy gives the forgeries' checks all the time a loaded machine
// needs: long timeouts, no hedge (one route), a long deadline.
const forgeryPolicy = `
policies:
  default:
    hedge: false
    control_fraction: 0
    deadline: 60s
    accept_timeout: 30s
    heartbeat_interval: 50ms
    heartbeat_timeout: 30s
`

// dropped reads hedgerow_replies_dropped_total{reason} ("" sums every reason).
func dropped(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	if reason == "" {
		return metricSum(t, []*prometheus.Registry{reg}, "hedgerow_replies_dropped_total", "", "")
	}
	return metricSum(t, []*prometheus.Registry{reg}, "hedgerow_replies_dropped_total", "reason", reason)
}

// forgedSecret is a well-formed secret that no attempt has.
const forgedSecret = "00000000000000000000000000000000"

// TestAReplyThatIsNotTheAttemptWorkersIsDropped: each rule of
// docs/architecture.md §8 that a reply must meet to be taken for its
// attempt. The fake worker accepts, sends one message that breaks the
// rule, waits for the dispatcher to count the drop, then answers; the
// answer committed is the worker's.
func TestAReplyThatIsNotTheAttemptWorkersIsDropped(t *testing.T) {
	result := func(a schemas.Attempt) schemas.AttemptResult {
		return schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, StatusClass: schemas.StatusOK,
			ErrorScope: schemas.ScopeNone, FinishReason: "stop", Content: "FORGED", Usage: schemas.Usage{InputUnits: 1, OutputUnits: 1}}
	}
	marshal := func(t *testing.T, m json.Marshaler) []byte {
		data, err := m.MarshalJSON()
		if err != nil {
			t.Error(err)
		}
		return data
	}
	for _, tc := range []struct {
		rule         string
		beforeAccept bool
		reason       string
		// forge returns the message to publish on the attempt's inbox
		// (its subject may be changed by returning another).
		forge func(t *testing.T, a schemas.Attempt) *nats.Msg
	}{
		{rule: "a reply naming another group is dropped", reason: dropGroup,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.GroupID, r.WorkerID, r.Secret = "other-group", fakeWorkerID, a.Secret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a reply naming another attempt than its inbox is dropped", reason: dropAttempt,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.Attempt, r.WorkerID, r.Secret = a.Attempt+1, fakeWorkerID, a.Secret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a reply on the inbox of an attempt never sent is dropped", reason: dropAttempt,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.Attempt, r.WorkerID, r.Secret = 7, fakeWorkerID, a.Secret
				return &nats.Msg{Subject: strings.TrimSuffix(a.ReplyInbox, ".1") + ".7", Data: marshal(t, r)}
			}},
		{rule: "a reply without the attempt's secret is dropped", reason: dropSecret,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.WorkerID = fakeWorkerID // and no secret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a reply with another secret is dropped", reason: dropSecret,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.WorkerID, r.Secret = fakeWorkerID, forgedSecret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a reply from another worker than the one that accepted is dropped", reason: dropWorker,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.WorkerID, r.Secret = "another-worker", a.Secret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a second accept from another worker is dropped", reason: dropWorker,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				acc := schemas.Accept{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "another-worker", ControlInbox: "_INBOX.rogue", Secret: a.Secret}
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, acc)}
			}},
		{rule: "a reply naming no worker is dropped", reason: dropWorker,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				hb := schemas.Heartbeat{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1, Secret: a.Secret}
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, hb)}
			}},
		{rule: "a result before any worker accepted is dropped", reason: dropWorker, beforeAccept: true,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.WorkerID, r.Secret = fakeWorkerID, a.Secret
				return &nats.Msg{Subject: a.ReplyInbox, Data: marshal(t, r)}
			}},
		{rule: "a no-responders status after an accept is dropped", reason: dropStatus,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				return &nats.Msg{Subject: a.ReplyInbox, Header: nats.Header{"Status": []string{"503"}}}
			}},
		{rule: "a reply on an inbox never issued is dropped", reason: dropUnknownInbox,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				r := result(a)
				r.WorkerID, r.Secret = fakeWorkerID, a.Secret
				parts := strings.Split(a.ReplyInbox, ".")
				parts[len(parts)-2] = "1" // the sequential token of old
				return &nats.Msg{Subject: strings.Join(parts, "."), Data: marshal(t, r)}
			}},
		{rule: "an undecodable reply is dropped", reason: dropMalformed,
			forge: func(t *testing.T, a schemas.Attempt) *nats.Msg {
				return &nats.Msg{Subject: a.ReplyInbox, Data: []byte(`{"v":1,"type":"result","group_id":`)}
			}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := newCluster(t, []string{"a"}, nil, forgeryPolicy)
			reg := prometheus.NewRegistry()
			gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg})
			proceed := make(chan struct{})
			startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
				if !tc.beforeAccept {
					fw.accept(a)
				}
				if err := fw.nc.PublishMsg(tc.forge(t, a)); err != nil {
					t.Error(err)
				}
				<-proceed
				fw.answer(a, "real answer")
			})
			done := make(chan error, 1)
			var resp *Response
			go func() {
				var err error
				resp, err = d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
				done <- err
			}()
			eventually.True(t, 30*time.Second, "the forged reply counted as "+tc.reason, func() bool {
				return dropped(t, reg, tc.reason) == 1
			})
			close(proceed)
			if err := <-done; err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if resp.Content != "real answer" {
				t.Errorf("committed %q, want the worker's answer", resp.Content)
			}
			if n := dropped(t, reg, ""); n != 1 {
				t.Errorf("%v replies dropped, want the forged one only", n)
			}
		})
	}
}

// TestARogueClientCommitsNoAnswerAndKillsNoRequest: a plain NATS client on
// the same (open) server reads every attempt and every inbox, and races
// forged answers to live attempts' inboxes — without the secret, with
// another group's id, with a guessed secret, on guessed inboxes — and sends
// forged cancels to the workers' control inboxes for every attempt it
// sees accepted. The providers hold every request until the forgeries have
// all been handled, so each one had its chance. What the rogue cannot be
// kept from (reading prompts, and copying a secret it read: §8) is for
// NATS authorization.
func TestARogueClientCommitsNoAnswerAndKillsNoRequest(t *testing.T) {
	const requests = 20
	hold := make(chan struct{})
	prov := newProvider(t, "a", newScript(behaviour{hold: hold, content: "real answer"}))
	c := newCluster(t, []string{"a"}, map[string]*provider{"a": prov}, forgeryPolicy)
	reg := prometheus.NewRegistry()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg})
	wreg := prometheus.NewRegistry()
	if err := c.workerMetrics.Register(wreg); err != nil {
		t.Fatal(err)
	}

	rogue := natstest.Connect(t, c.ns)
	var (
		attemptsSeen, repliesSent, cancelsSent atomic.Int64
		mu                                     sync.Mutex
		cancelled                              = make(map[string]bool) // group/attempt cancelled already
	)
	publish := func(subject string, m json.Marshaler) bool {
		data, err := m.MarshalJSON()
		if err == nil {
			err = rogue.Publish(subject, data)
		}
		if err != nil {
			t.Error(err)
			return false
		}
		return true
	}
	forge := func(inbox string, a schemas.Attempt, group, secret string) {
		for _, m := range []json.Marshaler{
			schemas.Accept{GroupID: group, Attempt: a.Attempt, WorkerID: "rogue", ControlInbox: "_INBOX.rogue", Secret: secret},
			schemas.FirstByte{GroupID: group, Attempt: a.Attempt, WorkerID: "rogue", Secret: secret},
			schemas.Chunk{GroupID: group, Attempt: a.Attempt, Seq: 1, Delta: "FORGED", Tokens: 1, CumulativeTokens: 1, First: true, WorkerID: "rogue", Secret: secret},
			schemas.AttemptResult{GroupID: group, Attempt: a.Attempt, WorkerID: "rogue", StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
				FinishReason: "stop", Content: "FORGED", LastSeq: 1, Usage: schemas.Usage{InputUnits: 1, OutputUnits: 1}, Secret: secret},
		} {
			if publish(inbox, m) {
				repliesSent.Add(1)
			}
		}
	}
	// (a) Forged answers to every attempt it reads.
	attempts, err := rogue.Subscribe(schemas.AttemptSubjectPrefix+">", func(m *nats.Msg) {
		var a schemas.Attempt
		if schemas.Decode(m.Data, &a) != nil {
			t.Error("the rogue could not read an attempt")
			return
		}
		attemptsSeen.Add(1)
		guessed, _ := schemas.NewAttemptSecret()
		forge(a.ReplyInbox, a, a.GroupID, "")             // the right group, no secret
		forge(a.ReplyInbox, a, "hg_rogue", guessed)       // a wrong group_id
		forge(a.ReplyInbox, a, a.GroupID, forgedSecret)   // a guessed secret
		parts := strings.Split(a.ReplyInbox, ".")         // a guessed inbox: the
		parts[len(parts)-2] = "1"                         // prefix every attempt carries
		forge(strings.Join(parts, "."), a, a.GroupID, "") // and a sequential token
	})
	if err != nil {
		t.Fatal(err)
	}
	defer attempts.Unsubscribe()
	// (b) Forged cancels for every attempt it sees a worker accept.
	inboxes, err := rogue.Subscribe("_INBOX.>", func(m *nats.Msg) {
		r, err := schemas.DecodeReply(m.Data)
		acc, ok := r.(*schemas.Accept)
		if err != nil || !ok || acc.WorkerID == "rogue" {
			return
		}
		key := acc.GroupID + "/" + acc.ControlInbox
		mu.Lock()
		first := !cancelled[key]
		cancelled[key] = true
		mu.Unlock()
		if !first {
			return
		}
		for _, secret := range []string{"", forgedSecret} {
			if publish(acc.ControlInbox, schemas.Cancel{GroupID: acc.GroupID, Attempt: acc.Attempt, Reason: schemas.CancelCallerGone, Secret: secret}) {
				cancelsSent.Add(1)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer inboxes.Unsubscribe()
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		resp    *Response
		content string
		err     error
	}
	outcomes := make(chan outcome, requests)
	for i := range requests {
		stream := i%2 == 1
		go func() {
			var streamed strings.Builder
			var sink Sink
			if stream {
				sink = sinkFunc(func(d Delta) error { streamed.WriteString(d.Content); return nil })
			}
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(stream)}, sink)
			content := streamed.String()
			if resp != nil && !stream {
				content = resp.Content
			}
			outcomes <- outcome{resp, content, err}
		}()
	}
	eventually.True(t, 60*time.Second, "every attempt read and its forgeries sent", func() bool {
		return attemptsSeen.Load() == requests && cancelsSent.Load() == 2*requests && repliesSent.Load() == 16*requests
	})
	eventually.True(t, 60*time.Second, "every forged reply dropped and every forged cancel rejected", func() bool {
		return dropped(t, reg, "") == float64(repliesSent.Load()) &&
			metricSum(t, []*prometheus.Registry{wreg}, "hedgerow_worker_cancels_rejected_total", "reason", worker.RejectSecret) == float64(cancelsSent.Load())
	})
	close(hold)

	committedForged, killed := 0, 0
	for range requests {
		o := <-outcomes
		switch {
		case o.err != nil:
			killed++
			t.Errorf("a request failed: %v", o.err)
		case o.content != "real answer":
			committedForged++
			t.Errorf("committed %q, want the provider's answer", o.content)
		}
	}
	select {
	case route := <-prov.gone:
		t.Errorf("a request to %s was cut off: a cancel was obeyed", route)
	default:
	}
	if n := metricSum(t, []*prometheus.Registry{wreg}, "hedgerow_worker_cancellations_total", "", ""); n != 0 {
		t.Errorf("workers counted %v cancels obeyed, want none", n)
	}
	t.Logf("forged replies sent %d, committed %d (drops: secret %v, group %v, worker %v, unknown_inbox %v); forged cancels sent %d, requests killed %d",
		repliesSent.Load(), committedForged, dropped(t, reg, dropSecret), dropped(t, reg, dropGroup), dropped(t, reg, dropWorker),
		dropped(t, reg, dropUnknownInbox), cancelsSent.Load(), killed)
}
