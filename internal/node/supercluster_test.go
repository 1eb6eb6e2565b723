package node

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// regionUnderTest is one region of the supercluster: its NATS server
// (a cluster of one, with JetStream), its Redis, two fake routes counting
// the requests that reach them, and its configuration.
type regionUnderTest struct {
	name    string
	ns      *server.Server
	cfg     *config.Config
	reached atomic.Int64 // requests at the region's fake routes
}

// newRegionUnderTest configures region name on its server ns; extra is
// YAML appended to its file (a global section, say).
func newRegionUnderTest(t *testing.T, name string, ns *server.Server, extra string) *regionUnderTest {
	t.Helper()
	r := &regionUnderTest{name: name, ns: ns}
	count := fakellm.Options{OnStart: func() { r.reached.Add(1) }}
	urlA := fakeServer(t, 0, calmModel(t), count) + "/v1"
	urlB := fakeServer(t, 1, calmModel(t), count) + "/v1"
	y := fmt.Sprintf(`deployment: {region: %s}
nats:
  urls: [%q]
http:
  listen: 127.0.0.1:0
redis: {url: %q, key_prefix: %s, hash_key_env: NODE_TEST_HASH_KEY}
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m}
  - {name: fake-b, provider: openai, base_url: %q, model: m}
pools:
  general: {routes: [fake-a, fake-b]}
policies:
  default: {control_fraction: 0, deadline: 3s, accept_timeout: 300ms, heartbeat_interval: 50ms}
%s`, name, ns.ClientURL(), redistest.Start(t).URL(), name, urlA, urlB, extra)
	cfg, err := config.Parse(name+".yaml", []byte(y), config.RoleServe, os.LookupEnv)
	if err != nil {
		t.Fatalf("config of %s: %v\n%s", name, err, y)
	}
	r.cfg = cfg
	return r
}

// start starts the region's workers and a gateway.
func (r *regionUnderTest) start(t *testing.T) (*Workers, *Gateway) {
	t.Helper()
	w, err := StartWorkers(r.cfg, natstest.Connect(t, r.ns, nats.Name(r.name+"-workers")), Options{DrainGrace: time.Second})
	if err != nil {
		t.Fatalf("%s workers: %v", r.name, err)
	}
	g, err := r.gateway(t)
	if err != nil {
		stop(t, w)
		t.Fatalf("%s gateway: %v", r.name, err)
	}
	return w, g
}

// gateway starts a gateway of the region on its configuration.
func (r *regionUnderTest) gateway(t *testing.T) (*Gateway, error) {
	return StartGateway(r.cfg, natstest.Connect(t, r.ns, nats.Name(r.name+"-gateway")), nil, Options{})
}

// post sends one chat completion to g and returns its status.
func (r *regionUnderTest) post(t *testing.T, g *Gateway) int {
	t.Helper()
	code, _ := postChat(t, "http://"+g.Addr().String())
	return code
}

// TestARegionsRequestsStayInTheRegion: two regions, east and west, each a
// one-server NATS cluster with JetStream, joined by gateway links as a
// supercluster, each with a gateway and workers of the same routes
// (docs/architecture.md §14, "Isolation"). East's requests are served by
// east's workers only; with east's workers stopped, east's requests fail —
// NATS, which would otherwise hand them to west's members of the same
// queue group, never takes them to west; and each region's records stream
// and gate bucket are its own, holding its own records. Without
// deployment.region the same test fails at (b): east's request is
// answered by west's worker. With it, east's attempts find no responder
// (the server knows no subscriber of east's subjects anywhere) and fail
// over to east's other route, then fail, as in a region of its own.
func TestARegionsRequestsStayInTheRegion(t *testing.T) {
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	sc := natstest.Supercluster(t, []string{"east", "west"}, natstest.MaxPayload(16<<20))
	eastNS := sc[0].Server
	east, west := newRegionUnderTest(t, "east", eastNS, ""), newRegionUnderTest(t, "west", sc[1].Server, "")

	eastWorkers, eastGW := east.start(t)
	westWorkers, westGW := west.start(t)
	defer stop(t, westWorkers)
	defer stop(t, westGW)
	defer stop(t, eastGW)

	// (a) Each region's requests are served by its own workers.
	const served = 4
	for range served {
		if code := east.post(t, eastGW); code != http.StatusOK {
			t.Fatalf("east's request: %d", code)
		}
	}
	if east.reached.Load() < served || west.reached.Load() != 0 {
		t.Fatalf("east's %d requests reached east's routes %d times and west's %d times; want west's never",
			served, east.reached.Load(), west.reached.Load())
	}
	if code := west.post(t, westGW); code != http.StatusOK {
		t.Fatalf("west's request: %d", code)
	}
	westBefore, eastBefore := west.reached.Load(), east.reached.Load()
	if westBefore == 0 {
		t.Fatal("west's request never reached west's routes")
	}

	// (b) With east's workers gone, west's are the only members of the
	// routes' queue groups in the supercluster; east's requests still
	// never reach them.
	stop(t, eastWorkers)
	const orphaned = 2
	for range orphaned {
		if code := east.post(t, eastGW); code == http.StatusOK {
			t.Fatal("east's request was answered with no worker in east")
		}
	}
	if got := west.reached.Load(); got != westBefore {
		t.Fatalf("east's requests reached west's routes %d times with east's workers stopped", got-westBefore)
	}
	if got := east.reached.Load(); got != eastBefore {
		t.Fatalf("east's routes were reached %d times with east's workers stopped", got-eastBefore)
	}
	if code := west.post(t, westGW); code != http.StatusOK {
		t.Fatalf("west's request while east has no workers: %d", code)
	}

	// (c) Each region's records stream and gate bucket are its own, under
	// names of its own, and hold only its records.
	js, err := jetstream.New(natstest.Connect(t, eastNS, nats.Name("inspector")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, tc := range []struct {
		region         string
		stream, bucket string
		subject        string
		groups         int
	}{
		{"east", "hedgerow_records_east", "hedgerow_gate_east", "hedgerow.east.records.>", served + orphaned},
		{"west", "hedgerow_records_west", "hedgerow_gate_west", "hedgerow.west.records.>", 2},
	} {
		s, err := js.Stream(ctx, tc.stream)
		if err != nil {
			t.Fatalf("%s's records stream %s: %v", tc.region, tc.stream, err)
		}
		if got := s.CachedInfo().Config.Subjects; !slices.Equal(got, []string{tc.subject}) {
			t.Errorf("%s's records stream keeps %q, want %q", tc.region, got, tc.subject)
		}
		if _, err := js.KeyValue(ctx, tc.bucket); err != nil {
			t.Errorf("%s's gate bucket %s: %v", tc.region, tc.bucket, err)
		}
		reader := records.Reader{JS: js, Stream: tc.stream, Region: tc.region}
		eventually.True(t, wait, fmt.Sprintf("%s's %d groups in %s", tc.region, tc.groups, tc.stream), func() bool {
			recs, err := reader.Records(ctx, time.Time{})
			return err == nil && len(recs.Groups) == tc.groups
		})
	}
	for _, shared := range []string{"hedgerow_records", "hedgerow_gate"} {
		if _, err := js.Stream(ctx, shared); err == nil {
			t.Errorf("a stream named %s exists: a region kept something under the region-less name", shared)
		}
	}
}
