package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// pinWait bounds every wait of these tests for the server or a worker.
const pinWait = 10 * time.Second

// startAuthServer runs a nats-server in process, on a free loopback port,
// on the server configuration Generate wrote for b; it returns the
// directory holding the secrets and the server's URL.
func startAuthServer(t *testing.T, b *Bundle) (string, string) {
	t.Helper()
	dir, opts := writeAndLoad(t, b)
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(pinWait) {
		t.Fatal("nats-server not ready")
	}
	return dir, s.ClientURL()
}

// violations collects the permission violations the server reports to
// one connection, asynchronously.
type violations struct {
	mu       sync.Mutex
	subjects []string // the errors' texts
	changed  chan struct{}
}

func newViolations() *violations { return &violations{changed: make(chan struct{}, 1)} }

func (v *violations) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		v.mu.Lock()
		v.subjects = append(v.subjects, err.Error())
		v.mu.Unlock()
		select {
		case v.changed <- struct{}{}:
		default:
		}
	})
}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.subjects...)
}

// waitFor waits until the server has refused a subscription to subject.
func (v *violations) waitFor(t *testing.T, subject string) {
	t.Helper()
	v.waitForRefusal(t, "permissions violation for subscription", subject)
}

// waitForPublish waits until the server has refused a publish to subject.
func (v *violations) waitForPublish(t *testing.T, subject string) {
	t.Helper()
	v.waitForRefusal(t, "permissions violation for publish", subject)
}

// waitForRefusal waits until the server has reported an error containing
// kind (lower case) about subject.
func (v *violations) waitForRefusal(t *testing.T, kind, subject string) {
	t.Helper()
	limit := time.NewTimer(pinWait)
	defer limit.Stop()
	for {
		for _, e := range v.all() {
			if strings.Contains(strings.ToLower(e), kind) && strings.Contains(e, `"`+subject+`"`) {
				return
			}
		}
		select {
		case <-v.changed:
		case <-limit.C:
			t.Fatalf("the server did not report %q for %q within %v; errors: %q", kind, subject, pinWait, v.all())
		}
	}
}

// connectUser connects to url as b's user name, with its inbox prefix; v,
// when set, collects the server's refusals.
func connectUser(t *testing.T, b *Bundle, dir, url, name string, v *violations) *nats.Conn {
	t.Helper()
	u, ok := b.User(name)
	if !ok {
		t.Fatalf("no user %s", name)
	}
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(dir, u.SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{seed, nats.CustomInboxPrefix(u.InboxPrefix), nats.Name("test-" + name)}
	if v != nil {
		opts = append(opts, v.option())
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// answering is an upstream that answers every request at once.
type answering struct{}

func (answering) Stream(context.Context, *schemas.ChatRequest, upstream.Sink) (upstream.Outcome, error) {
	return upstream.Outcome{FinishReason: "stop", Content: "ok", WellFormed: true,
		Usage: schemas.Usage{InputUnits: 1, OutputUnits: 1}}, nil
}

// pinnedAttempt is an attempt of route a, as a gateway publishes it.
func pinnedAttempt(t *testing.T, replyInbox string) schemas.Attempt {
	t.Helper()
	secret, err := schemas.NewAttemptSecret()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	return schemas.Attempt{
		Secret: secret, GroupID: "g-pinned", UserActionID: "ua_test", Attempt: 1, Role: schemas.RolePrimary, Route: "a",
		OperationClass: "chat", ModelClass: "general",
		DeadlineUnixMs: now.Add(30 * time.Second).UnixMilli(), RemainingMs: 30_000,
		CommitPoint: schemas.FirstToken, ReplyInbox: replyInbox,
		Request: schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hi")}}},
	}
}

// A process holding a worker's credentials may take its routes' attempts
// only as a member of their queue group (docs/architecture.md §13): every
// other subscription that would deliver attempts to it, or let it answer
// the gateways' service pings, is refused by the server, and receives
// nothing; the real worker, which subscribes only so, still starts without
// a refusal, answers attempts and answers its own service's pings.
func TestAWorkersCredentialsTakeAttemptsOnlyInTheQueueGroupAndAnswerOnlyItsOwnPings(t *testing.T) {
	b, err := Generate(spec()) // worker user wa serves route a; wab serves a and b
	if err != nil {
		t.Fatal(err)
	}
	dir, url := startAuthServer(t, b)
	gwViolations := newViolations()
	gw := connectUser(t, b, dir, url, UserGateway, gwViolations)

	// The real worker, with wa's credentials.
	waViolations := newViolations()
	wc := connectUser(t, b, dir, url, "wa", waViolations)
	w, err := worker.New(worker.Options{Route: "a", Upstream: answering{}, Conn: wc})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatalf("the worker does not start with its own credentials: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), pinWait)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("stop worker: %v", err)
		}
	})

	// A rogue process with the same credentials.
	rogueViolations := newViolations()
	rogue := connectUser(t, b, dir, url, "wa", rogueViolations)
	refused := []struct {
		name, subject, queue string
	}{
		{"its route's attempts outside the queue group", "hedgerow.attempt.a", ""},
		{"its route's attempts in a queue group of its own", "hedgerow.attempt.a", "rogue"},
		{"another route's attempts in that route's queue group", "hedgerow.attempt.b", "hedgerow-worker-b"},
		{"every route's attempts", "hedgerow.attempt.*", ""},
		{"every route's attempts in its route's queue group", "hedgerow.attempt.*", "hedgerow-worker-a"},
		{"everything under the attempts", "hedgerow.attempt.>", ""},
		{"the gateways' service pings", "$SRV.PING.hedgerow", ""},
		{"the gateways' service info", "$SRV.INFO.hedgerow", ""},
		{"the gateways' service stats", "$SRV.STATS.hedgerow", ""},
		{"every verb of the gateways' service", "$SRV.*.hedgerow", ""},
		{"each gateway's own pings", "$SRV.PING.hedgerow.*", ""},
		{"every service's control subjects", "$SRV.>", ""},
		{"every generic and per-service verb at once", "$SRV.*", ""},
		{"every service by name", "$SRV.*.*", ""},
	}
	delivered := make(chan *nats.Msg, 64)
	for _, tt := range refused {
		t.Run("refused: "+tt.name, func(t *testing.T) {
			var err error
			if tt.queue == "" {
				_, err = rogue.ChanSubscribe(tt.subject, delivered)
			} else {
				_, err = rogue.ChanQueueSubscribe(tt.subject, tt.queue, delivered)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := rogue.Flush(); err != nil {
				t.Fatal(err)
			}
			rogueViolations.waitFor(t, tt.subject)
		})
	}

	t.Run("the real worker met no refusal", func(t *testing.T) {
		if err := wc.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := waViolations.all(); len(got) > 0 {
			t.Fatalf("the worker's own subscriptions were refused: %q", got)
		}
	})

	t.Run("the real worker answers its route's attempts and the rogue receives none", func(t *testing.T) {
		replies, err := gw.SubscribeSync(gw.NewInbox())
		if err != nil {
			t.Fatal(err)
		}
		// The rogue's one permitted subscription: its control inbox, where
		// the gateway's marker arrives after both attempts.
		marker, err := rogue.SubscribeSync(schemas.WorkerInboxPrefix + ".rogue")
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(rogue.Flush(), gw.Flush()); err != nil {
			t.Fatal(err)
		}
		att := pinnedAttempt(t, replies.Subject)
		data, err := att.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		// As the dispatcher publishes it: the reply subject is the inbox,
		// which allow_responses lets the worker answer.
		if err := gw.PublishRequest(schemas.AttemptSubject("a"), att.ReplyInbox, data); err != nil {
			t.Fatal(err)
		}
		// Route b has no worker here: only a subscription of the rogue's
		// could take it.
		if err := gw.Publish(schemas.AttemptSubject("b"), data); err != nil {
			t.Fatal(err)
		}
		if err := gw.Publish(marker.Subject, []byte("marker")); err != nil {
			t.Fatal(err)
		}
		msg, err := replies.NextMsg(pinWait)
		if err != nil {
			t.Fatalf("the worker did not answer the attempt: %v", err)
		}
		reply, err := schemas.DecodeReply(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		acc, ok := reply.(*schemas.Accept)
		if !ok || acc.WorkerID != w.ID() || acc.Secret != att.Secret {
			t.Fatalf("first reply %s, want the worker's Accept returning the attempt's secret", msg.Data)
		}
		// One server delivers one publisher's messages to one connection in
		// order: once the marker is in, the attempts were delivered to
		// every subscription of the rogue's that they ever would reach.
		if _, err := marker.NextMsg(pinWait); err != nil {
			t.Fatalf("no marker: %v", err)
		}
		if n := len(delivered); n > 0 {
			t.Fatalf("the rogue's refused subscriptions received %d messages", n)
		}
	})

	t.Run("the real worker answers its own service's pings", func(t *testing.T) {
		subject, err := micro.ControlSubject(micro.PingVerb, schemas.WorkerServiceName, "")
		if err != nil {
			t.Fatal(err)
		}
		msg, err := gw.Request(subject, nil, pinWait)
		if err != nil {
			t.Fatalf("ping %s: %v", subject, err)
		}
		var ping micro.Ping
		if err := json.Unmarshal(msg.Data, &ping); err != nil || ping.Name != schemas.WorkerServiceName || ping.Metadata["route"] != "a" {
			t.Fatalf("ping answer %s (%v), want %s of route a", msg.Data, err, schemas.WorkerServiceName)
		}
	})
	if got := gwViolations.all(); len(got) > 0 {
		t.Errorf("the gateway's publications were refused: %q", got)
	}
}
