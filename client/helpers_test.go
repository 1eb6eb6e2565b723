package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait for something the system does as soon as the test
// acts; reaching it is a failure.
const wait = 10 * time.Second

// hedgerow is `hedgerow serve` (embedded NATS listening on loopback, a worker
// per route, the gateway with both front doors) in front of fake LLM routes.
type hedgerow struct {
	serve   *node.Serve
	users   *natsauth.Local // serve's NATS users, in a directory Stop removes
	fakes   []*fakellm.Server
	servers []*httptest.Server
	// started receives once per request that reached a route; records once
	// per request a route finished, with how it ended.
	started chan struct{}
	records chan fakellm.Record
}

// startHedgerow serves pool "general" over routes fake LLM routes playing
// model, with a policy whose deadline is 5 s.
func startHedgerow(routes int, model *workload.Model) (*hedgerow, error) {
	h := &hedgerow{started: make(chan struct{}, 1024), records: make(chan fakellm.Record, 1024)}
	var y strings.Builder
	y.WriteString("http: {listen: \"127.0.0.1:0\"}\nroutes:\n")
	var names []string
	for i := range routes {
		fake, err := fakellm.New(fakellm.Options{Model: model, Seed: 11, Route: i,
			OnStart: func() {
				select {
				case h.started <- struct{}{}:
				default:
				}
			},
			OnRecord: func(r fakellm.Record) {
				select {
				case h.records <- r:
				default:
				}
			}})
		if err != nil {
			h.Stop()
			return nil, err
		}
		srv := httptest.NewServer(fake)
		h.fakes, h.servers = append(h.fakes, fake), append(h.servers, srv)
		name := fmt.Sprintf("fake-%c", 'a'+i)
		names = append(names, name)
		fmt.Fprintf(&y, "  - {name: %s, provider: openai, base_url: %q, model: m, labels: {region: %c}}\n", name, srv.URL+"/v1", 'a'+i)
	}
	fmt.Fprintf(&y, "pools:\n  general: {routes: [%s]}\n", strings.Join(names, ", "))
	y.WriteString("policies:\n  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}\n")
	// Callers connect over TCP, so serve listens, with users.
	dir, err := os.MkdirTemp("", "hedgerow-client-test-")
	if err != nil {
		h.Stop()
		return nil, err
	}
	if h.users, err = natsauth.WriteLocal(dir, names, natsauth.ResponsesFor(5*time.Second, 50*time.Millisecond)); err != nil {
		_ = os.RemoveAll(dir)
		h.Stop()
		return nil, err
	}
	y.WriteString("nats:\n  listen: \"127.0.0.1:0\"\n" + h.users.ServeYAML())
	cfg, err := config.Parse("client-test.yaml", []byte(y.String()), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		h.Stop()
		return nil, fmt.Errorf("config: %w\n%s", err, y.String())
	}
	if h.serve, err = node.StartServe(cfg, node.Options{}); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// NATSURL is where callers connect.
func (h *hedgerow) NATSURL() string { return h.serve.NATSURL() }

// Stop shuts serve down, then the routes.
func (h *hedgerow) Stop() error {
	var errs []error
	if h.serve != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		errs = append(errs, h.serve.Stop(ctx))
	}
	for _, f := range h.fakes {
		f.Close()
	}
	for _, s := range h.servers {
		s.Close()
	}
	if h.users != nil {
		errs = append(errs, os.RemoveAll(h.users.Dir))
	}
	return errors.Join(errs...)
}

// newHedgerow starts a hedgerow for the test and a NATS connection to it.
func newHedgerow(t *testing.T, routes int, model *workload.Model) (*hedgerow, *nats.Conn) {
	t.Helper()
	h, err := startHedgerow(routes, model)
	if err != nil {
		t.Fatalf("start hedgerow: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(); err != nil {
			t.Errorf("stop hedgerow: %v", err)
		}
	})
	nc, err := h.users.Connect(h.NATSURL(), natsauth.UserClient)
	if err != nil {
		t.Fatalf("connect to %s: %v", h.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	return h, nc
}

// nextRecord waits for the next request a route finished.
func (h *hedgerow) nextRecord(t *testing.T) fakellm.Record {
	t.Helper()
	select {
	case r := <-h.records:
		return r
	case <-time.After(wait):
		t.Fatal("no route finished a request")
		return fakellm.Record{}
	}
}

// waitStarted waits until a request reached a route.
func (h *hedgerow) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-h.started:
	case <-time.After(wait):
		t.Fatal("no request reached a route")
	}
}

// instant answers every request at once with exactly tokens tokens.
func instant(t testing.TB, tokens int) *workload.Model {
	t.Helper()
	m, err := fakellm.InstantModel(tokens)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// paced is instant, but one token every 10 ms, so a stream has many chunks.
func paced(t testing.TB, tokens int) *workload.Model {
	m := instant(t, tokens)
	m.TokensPerSecond = 100
	return m
}

// hanging never answers: the first byte never comes.
func hanging(t testing.TB) *workload.Model {
	m := instant(t, 5)
	m.TTFT.HangFraction = 1
	return m
}

// ask is a request of pool "general" with prompt.
func ask(prompt string) schemas.SubmitRequest {
	return schemas.SubmitRequest{ModelClass: "general", Request: schemas.ChatRequest{
		Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(prompt)}},
	}}
}
