package dispatcher

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
)

// This file lends the in-process cluster harness to the end-to-end tests of
// the front doors (doors_e2e_test.go, package dispatcher_test), which run a
// real door in front of the real runtime. They cannot live in package
// dispatcher: the doors import it.

type (
	TestCluster  = cluster
	TestProvider = provider
	TestScript   = script
	Behaviour    = behaviour
	FakeWorker   = fakeWorker
)

var (
	NewTestCluster          = newCluster
	NewTestClusterWithPool  = newClusterWithPool
	NewTestProvider         = newProvider
	NewTestMessagesProvider = newMessagesProvider
	NewTestScript           = newScript
	TwoRoutes               = twoRoutes
	StartFakeWorker         = startFakeWorker
	WaitGone                = waitGone
	TestChat                = chat
	TestPolicyYAML          = policyYAML
)

// Words is a provider answering n content tokens; Hang one that never
// answers; Status one that answers an HTTP error at once; Late one whose
// first byte comes after wait; StallAfter one that answers n tokens and
// then only keeps the stream alive until its client goes away.
func StallAfter(n int) Behaviour                   { return behaviour{words: n, stall: true} }
func Words(n int) Behaviour                        { return behaviour{words: n} }
func Hang() Behaviour                              { return behaviour{hang: true} }
func Status(code int) Behaviour                    { return behaviour{status: code} }
func Late(wait time.Duration, words int) Behaviour { return behaviour{firstByte: wait, words: words} }

func (c *cluster) Dispatcher() *Dispatcher                   { return c.d }
func (c *cluster) AddDispatcher(base Options) *Dispatcher    { return c.addDispatcher(base) }
func (c *cluster) Conn() *nats.Conn                          { return c.nc }
func (c *cluster) Server() *server.Server                    { return c.ns }
func (c *cluster) Workers() []*worker.Worker                 { return c.workers }
func (c *cluster) Groups() <-chan schemas.GroupRecord        { return c.groups }
func (c *cluster) GroupRecord(id string) schemas.GroupRecord { return c.groupRecord(id) }
func (c *cluster) AttemptRecords(id string, n int) map[int]schemas.AttemptRecord {
	return c.attemptRecords(id, n)
}

// PoolRoutes is each configured pool's routes, as a front door's readiness
// check takes them.
func (c *cluster) PoolRoutes() map[string][]string {
	out := map[string][]string{}
	for name, p := range c.cfg.Pools {
		out[name] = slices.Clone(p.Routes)
	}
	return out
}

func (p *provider) Arrived() <-chan string { return p.arrived }
func (p *provider) Bodies() <-chan []byte  { return p.bodies }
func (p *provider) Gone() <-chan string    { return p.gone }

// NewStallingProvider streams one content chunk, then holds the response
// open until its client goes away, which it reports on Gone.
func NewStallingProvider(t *testing.T, route string) *provider {
	p := &provider{arrived: make(chan string, 16), gone: make(chan string, 16), route: route}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.arrived <- route
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"first "},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		p.gone <- route
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (fw *fakeWorker) Accept(a schemas.Attempt)        { fw.accept(a) }
func (fw *fakeWorker) Send(a schemas.Attempt, msg any) { fw.send(a, msg) }
func (fw *fakeWorker) Cancels() <-chan schemas.Cancel  { return fw.cancels }
