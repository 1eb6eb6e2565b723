package node

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// lookups is an environment that holds every variable and remembers which
// were read.
type lookups struct {
	mu    sync.Mutex
	names []string
}

func (l *lookups) env(name string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names = append(l.names, name)
	return "value-of-" + name, true
}

func (l *lookups) read(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.names, name)
}

// A worker process never reads the deployment hash key
// (docs/architecture.md §9, §10): with redis.hash_key_env naming a
// variable that is set, it reads the route's provider key and not the hash
// key, and the prompt fingerprint of its record is not keyed with it.
func TestAWorkerProcessNeverReadsTheHashKey(t *testing.T) {
	const hashKeyEnv, providerKeyEnv = "TEST_HASH_KEY", "TEST_PROVIDER_KEY"
	y := fmt.Sprintf(`nats: {urls: [nats://127.0.0.1:4222]}
redis: {hash_key_env: %s}
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m, api_key_env: %s}
pools:
  general: {routes: [fake-a]}
`, hashKeyEnv, fakeRoute(t, 0), providerKeyEnv)
	env := &lookups{}
	cfg, err := config.Parse("worker.yaml", []byte(y), config.RoleWorker, env.env)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(8<<20)))
	records, err := nc.SubscribeSync(schemas.AttemptRecordSubject)
	if err != nil {
		t.Fatal(err)
	}
	w, err := StartWorkers(cfg, nc, Options{Env: env.env})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, w)

	secret, err := schemas.NewAttemptSecret()
	if err != nil {
		t.Fatal(err)
	}
	req := schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hi")}}}
	att := schemas.Attempt{
		Secret: secret, GroupID: "g-hash", UserActionID: "ua_test", Attempt: 1, Role: schemas.RolePrimary, Route: "fake-a",
		OperationClass: "chat", ModelClass: "general",
		DeadlineUnixMs: time.Now().Add(wait).UnixMilli(), RemainingMs: wait.Milliseconds(),
		CommitPoint: schemas.Complete, ReplyInbox: nc.NewInbox(), Request: req,
	}
	replies, err := nc.SubscribeSync(att.ReplyInbox)
	if err != nil {
		t.Fatal(err)
	}
	data, err := att.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.AttemptSubject("fake-a"), Reply: att.ReplyInbox, Data: data}); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := replies.NextMsg(wait)
		if err != nil {
			t.Fatalf("no attempt result: %v", err)
		}
		r, err := schemas.DecodeReply(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if res, ok := r.(*schemas.AttemptResult); ok {
			if res.StatusClass != schemas.StatusOK {
				t.Fatalf("attempt result %s, want ok", msg.Data)
			}
			break
		}
	}
	msg, err := records.NextMsg(wait)
	if err != nil {
		t.Fatalf("no attempt record: %v", err)
	}
	var rec schemas.AttemptRecord
	if err := schemas.Decode(msg.Data, &rec); err != nil {
		t.Fatal(err)
	}

	if !env.read(providerKeyEnv) {
		t.Errorf("the worker did not read its route's provider key %s", providerKeyEnv)
	}
	if env.read(hashKeyEnv) {
		t.Errorf("the worker read the hash key %s", hashKeyEnv)
	}
	keyed, err := req.Fingerprint([]byte("value-of-" + hashKeyEnv))
	if err != nil {
		t.Fatal(err)
	}
	if rec.PromptFingerprint == keyed {
		t.Errorf("the worker's record fingerprints the prompt with the hash key")
	}
}
