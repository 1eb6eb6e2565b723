package httpdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// startWorkerServices registers, for each route, the micro service a
// worker of that route registers, so readiness pings find it.
func startWorkerServices(t *testing.T, nc *nats.Conn, routes ...string) []micro.Service {
	t.Helper()
	var out []micro.Service
	for _, r := range routes {
		svc, err := micro.AddService(nc, micro.Config{Name: schemas.WorkerServiceName, Version: "1.0.0", Metadata: map[string]string{"route": r}})
		if err != nil {
			t.Fatalf("register worker of %s: %v", r, err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
		out = append(out, svc)
	}
	// The server has the services' subscriptions before anyone pings them.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHTTPReadinessNeedsNATSAndALiveWorkerForEveryPool(t *testing.T) {
	ns := natstest.Start(t)
	nc := natstest.Connect(t, ns)
	startWorkerServices(t, natstest.Connect(t, ns), "a", "b")
	closed := natstest.Connect(t, ns)
	closed.Close()
	tests := []struct {
		name    string
		opts    Options
		status  int
		missing map[string][]string
		nats    string
	}{
		{name: "every pool has a live worker", opts: Options{Conn: nc}, status: 200, nats: "CONNECTED"},
		{name: "a pool whose routes have no worker", opts: Options{Conn: nc, Pools: map[string][]string{"general": {"a", "b"}, "dark": {"x", "y"}}},
			status: 503, missing: map[string][]string{"dark": {"x", "y"}}, nats: "CONNECTED"},
		{name: "a closed NATS connection", opts: Options{Conn: closed}, status: 503, nats: "CLOSED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.ReadyProbeWindow = 100 * time.Millisecond
			srv := frontDoor(t, frontdoortest.New(nil), tc.opts)
			resp, body := get(t, srv.URL+"/readyz")
			var rep readyReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if resp.StatusCode != tc.status || rep.Ready != (tc.status == 200) || rep.NATS != tc.nats ||
				fmt.Sprint(rep.PoolsWithoutWorkers) != fmt.Sprint(tc.missing) {
				t.Fatalf("status %d %s, want %d with missing %v", resp.StatusCode, body, tc.status, tc.missing)
			}
		})
	}
}

// testClock is a settable clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestHTTPReadinessIsReusedUntilItsTTLExpires(t *testing.T) {
	ns := natstest.Start(t)
	workerConn := natstest.Connect(t, ns)
	workers := startWorkerServices(t, workerConn, "a", "b")
	clock := &testClock{now: time.Unix(1_700_000_000, 0)}
	srv := frontDoor(t, frontdoortest.New(nil), Options{Conn: natstest.Connect(t, ns), Now: clock.Now, ReadyCacheTTL: time.Second, ReadyProbeWindow: 100 * time.Millisecond})
	status := func() int { resp, _ := get(t, srv.URL+"/readyz"); return resp.StatusCode }
	if s := status(); s != http.StatusOK {
		t.Fatalf("readyz %d with live workers", s)
	}
	for _, w := range workers {
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if err := workerConn.Flush(); err != nil { // the server has dropped their subscriptions
		t.Fatal(err)
	}
	if s := status(); s != http.StatusOK {
		t.Fatalf("readyz %d within the TTL, want the cached 200", s)
	}
	clock.Add(time.Second)
	if s := status(); s != http.StatusServiceUnavailable {
		t.Fatalf("readyz %d after the TTL with every worker stopped, want 503", s)
	}
}
