package httpdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

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
		svc, err := micro.AddService(nc, micro.Config{Name: schemas.WorkerServiceName, Version: "1.0.0",
			Metadata: map[string]string{"route": r, "worker_id": "w-" + r}})
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

// TestHTTPReadinessNeedsNATSAndItsOwnWorkersAndOnlyReportsPoolsWithoutWorkers:
// /readyz says whether this door can serve — NATS connected and, when the
// process has workers of its own (serve), each of them answering — and a
// pool without a live worker is named in its body without making it
// unready (one dark pool must not take every gateway out of the Service).
func TestHTTPReadinessNeedsNATSAndItsOwnWorkersAndOnlyReportsPoolsWithoutWorkers(t *testing.T) {
	ns := natstest.Start(t)
	nc := natstest.Connect(t, ns)
	startWorkerServices(t, natstest.Connect(t, ns), "a", "b")
	closed := natstest.Connect(t, ns)
	closed.Close()
	alone := natstest.Connect(t, natstest.Start(t)) // a server no worker is on: the ping meets no responders
	twoPools := map[string][]string{"general": {"a", "b"}, "dark": {"x", "y"}}
	tests := []struct {
		name        string
		opts        Options
		status      int
		missing     map[string][]string
		ownsMissing []string
		nats        string
	}{
		{name: "every pool has a live worker", opts: Options{Conn: nc}, status: 200, nats: "CONNECTED"},
		{name: "a pool whose routes have no worker is reported, still ready", opts: Options{Conn: nc, Pools: twoPools},
			status: 200, missing: map[string][]string{"dark": {"x", "y"}}, nats: "CONNECTED"},
		{name: "no pool has a worker, still ready", opts: Options{Conn: nc, Pools: map[string][]string{"dark": {"x"}}},
			status: 200, missing: map[string][]string{"dark": {"x"}}, nats: "CONNECTED"},
		{name: "no worker at all on the server, still ready", opts: Options{Conn: alone},
			status: 200, missing: map[string][]string{"general": {"a", "b"}}, nats: "CONNECTED"},
		{name: "its own workers answer", opts: Options{Conn: nc, Pools: twoPools, OwnWorkers: map[string]string{"w-a": "a", "w-b": "b"}},
			status: 200, missing: map[string][]string{"dark": {"x", "y"}}, nats: "CONNECTED"},
		{name: "one of its own workers is not registered", opts: Options{Conn: nc, OwnWorkers: map[string]string{"w-a": "a", "w-gone": "c"}},
			status: 503, ownsMissing: []string{"c"}, nats: "CONNECTED"},
		{name: "a closed NATS connection", opts: Options{Conn: closed}, status: 503, missing: map[string][]string{"general": {"a", "b"}}, nats: "CLOSED"},
		{name: "no NATS connection", opts: Options{}, status: 503, nats: "NOT_CONFIGURED"},
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
				fmt.Sprint(rep.PoolsWithoutWorkers) != fmt.Sprint(tc.missing) || fmt.Sprint(rep.OwnWorkersMissing) != fmt.Sprint(tc.ownsMissing) {
				t.Fatalf("status %d %s, want %d with pools without workers %v, own workers missing %v", resp.StatusCode, body, tc.status, tc.missing, tc.ownsMissing)
			}
		})
	}
}

// TestHTTPStatusAndMetricsNameEachPoolWithoutALiveWorker: the status
// endpoint lists every pool with its routes and liveness, and
// hedgerow_pool_without_workers is 1 for the dark pool only, both beside
// a /readyz that stays 200.
func TestHTTPStatusAndMetricsNameEachPoolWithoutALiveWorker(t *testing.T) {
	ns := natstest.Start(t)
	startWorkerServices(t, natstest.Connect(t, ns), "a")
	reg := prometheus.NewRegistry()
	srv := frontDoor(t, frontdoortest.New(nil), Options{Conn: natstest.Connect(t, ns), ReadyProbeWindow: 100 * time.Millisecond,
		Pools: map[string][]string{"general": {"a", "b"}, "dark": {"x"}}, Registerer: reg, Gatherer: reg})
	resp, body := get(t, srv.URL+StatusPath)
	var st statusReport
	if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s: %v", resp.StatusCode, body, err)
	}
	want := map[string]poolStatus{"general": {Routes: []string{"a", "b"}, Live: true}, "dark": {Routes: []string{"x"}, Live: false}}
	if !st.Ready || fmt.Sprint(st.Pools) != fmt.Sprint(want) {
		t.Fatalf("status %s, want ready with pools %v", body, want)
	}
	if resp, _ := get(t, srv.URL+"/readyz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d with one dark pool, want 200", resp.StatusCode)
	}
	_, metrics := get(t, srv.URL+"/metrics")
	for _, line := range []string{`hedgerow_pool_without_workers{pool="dark"} 1`, `hedgerow_pool_without_workers{pool="general"} 0`} {
		if !strings.Contains(string(metrics), line) {
			t.Errorf("/metrics lacks %s:\n%s", line, metrics)
		}
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
	srv := frontDoor(t, frontdoortest.New(nil), Options{Conn: natstest.Connect(t, ns), Now: clock.Now, ReadyCacheTTL: time.Second, ReadyProbeWindow: 100 * time.Millisecond,
		OwnWorkers: map[string]string{"w-a": "a", "w-b": "b"}})
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
		t.Fatalf("readyz %d after the TTL with its own workers stopped, want 503", s)
	}
}
