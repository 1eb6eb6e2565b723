package node

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// heldProvider is an OpenAI-compatible route that holds every chat request
// until release is closed, then answers it: a test sees an attempt in
// flight for as long as it likes.
type heldProvider struct {
	srv     *httptest.Server
	arrived chan struct{}
	release chan struct{}
}

func newHeldProvider(t *testing.T) *heldProvider {
	t.Helper()
	p := &heldProvider{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.arrived <- struct{}{}
		select {
		case <-p.release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"held\"},\"finish_reason\":\"stop\"}]}\n\n"+
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
		p.srv.Close()
	})
	return p
}

func (p *heldProvider) waitArrived(t *testing.T) {
	t.Helper()
	select {
	case <-p.arrived:
	case <-time.After(wait):
		t.Fatal("no request reached the provider")
	}
}

// leaseYAML is a configuration whose two routes both call p, without
// hedging, with redis.url set to rs under key prefix "leases"; extraRedis
// adds keys to the redis section.
func leaseYAML(p *heldProvider, rs *redistest.Server, extraRedis string) string {
	return fmt.Sprintf(`nats:
  urls: [nats://127.0.0.1:4222]
http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %[1]q, model: m}
  - {name: fake-b, provider: openai, base_url: %[1]q, model: m}
pools:
  general: {routes: [fake-a, fake-b]}
policies:
  default: {hedge: false, control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
redis: {url: %[2]q, key_prefix: leases%[3]s}
`, p.srv.URL+"/v1", rs.URL(), extraRedis)
}

// observer reads the route leases in rs as a dispatcher replica does.
func observer(t *testing.T, rs *redistest.Server) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Prefix: "leases", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitLeases waits until the routes hold want leases between them; they
// are taken and given back off the attempt's path, so it polls.
func waitLeases(t *testing.T, s *redisstore.Store, want int) {
	t.Helper()
	eventually.True(t, wait, fmt.Sprintf("%d route leases in redis", want), func() bool {
		n, err := s.InFlight(t.Context(), []string{"fake-a", "fake-b"})
		return err == nil && n["fake-a"]+n["fake-b"] == want
	})
}

// TestWorkerProcessWithRedisHoldsARouteLeaseWhileBusy: `hedgerow worker`
// with redis.url and no hash_key_env (a worker needs none) keeps a lease
// on its route in Redis while an attempt runs, and gives it back after.
func TestWorkerProcessWithRedisHoldsARouteLeaseWhileBusy(t *testing.T) {
	rs := redistest.Start(t)
	p := newHeldProvider(t)
	cfg, err := config.Parse("worker.yaml", []byte(leaseYAML(p, rs, "")), config.RoleWorker, os.LookupEnv)
	if err != nil {
		t.Fatalf("a worker config with redis.url and no hash_key_env: %v", err)
	}
	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	wc, dc := natstest.Connect(t, ns, nats.Name("workers")), natstest.Connect(t, ns, nats.Name("dispatcher"))
	w, err := StartWorkers(cfg, wc, Options{Routes: []string{"fake-a"}, DrainGrace: time.Second})
	if err != nil {
		t.Fatalf("StartWorkers: %v", err)
	}
	defer stop(t, w)
	leases := observer(t, rs)

	inbox := dc.NewInbox()
	replies, err := dc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	att := schemas.Attempt{
		GroupID: "hg_node_lease", UserActionID: "ua_node", Attempt: 1, Role: schemas.RolePrimary, Route: "fake-a",
		OperationClass: "chat", ModelClass: "general",
		DeadlineUnixMs: now.Add(wait).UnixMilli(), RemainingMs: wait.Milliseconds(),
		CommitPoint: schemas.FirstToken, ReplyInbox: inbox,
		Request: schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hi")}}},
	}
	data, err := att.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := dc.Publish(schemas.AttemptSubject("fake-a"), data); err != nil {
		t.Fatal(err)
	}
	p.waitArrived(t)
	waitLeases(t, leases, 1)

	close(p.release)
	waitResult(t, replies)
	waitLeases(t, leases, 0)
}

// waitResult reads an attempt's replies up to its result.
func waitResult(t *testing.T, replies *nats.Subscription) {
	t.Helper()
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
				t.Fatalf("attempt ended %s", res.StatusClass)
			}
			return
		}
	}
}

// TestServeWorkersKeepTheirLeasesInTheGatewaysRedis: in serve with
// redis.url the workers record their attempts in the Redis store the
// dispatcher uses, so other replicas see this one's load.
func TestServeWorkersKeepTheirLeasesInTheGatewaysRedis(t *testing.T) {
	rs := redistest.Start(t)
	p := newHeldProvider(t)
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	cfg, err := config.Parse("serve.yaml", []byte(leaseYAML(p, rs, ", hash_key_env: NODE_TEST_HASH_KEY")), config.RoleServe, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	if s.shared.leases() != s.shared.store {
		t.Fatal("serve's workers do not record their leases in the dispatcher's store")
	}
	leases := observer(t, rs)

	answered := make(chan int, 1)
	go func() {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
			"http://"+s.HTTPAddr().String()+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			answered <- 0
			return
		}
		req.Header.Set("Content-Type", "application/json")
		client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	p.waitArrived(t)
	waitLeases(t, leases, 1)
	close(p.release)
	select {
	case status := <-answered:
		if status != http.StatusOK {
			t.Fatalf("chat completion: %d", status)
		}
	case <-time.After(wait):
		t.Fatal("no answer")
	}
	waitLeases(t, leases, 0)
}
