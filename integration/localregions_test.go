package integration

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/regions"
)

// TestLocalRegionsAnswerInEachRegionAndThroughACutLinkThenStopEverything is
// the smoke test of `make regions` (internal/tools/regions) on free ports
// in a temporary directory: both regions come up linked through the fault
// proxies, each gateway answers a request, each still answers with the
// link cut both ways, and Down leaves no process running and no port
// listened on.
func TestLocalRegionsAnswerInEachRegionAndThroughACutLinkThenStopEverything(t *testing.T) {
	bins := buildBinaries(t)
	redisServer := redisServerBinary(t)
	ports, err := regions.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := regions.Spec{Dir: dir, Hedgerow: bins.hedgerow, NATSServer: bins.natsServer, RedisServer: redisServer,
		Ports: ports, Delay: 20 * time.Millisecond, TimeScale: 0.2}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out strings.Builder
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = regions.Down(dir, io.Discard)
		}
	})
	start := time.Now()
	if err := regions.Up(ctx, spec, &out); err != nil {
		t.Fatalf("regions up: %v\n%s", err, out.String())
	}
	t.Logf("regions up in %v", time.Since(start).Round(time.Millisecond))
	m, err := regions.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Parts {
		if !p.Running() {
			t.Errorf("%s is not running after up", p.Name)
		}
	}
	for _, r := range regions.Names {
		askLocal(ctx, t, m.GatewayURL(r), "smoke-"+r)
	}
	cut := true
	if err := m.Link(ctx, -1, &cut); err != nil {
		t.Fatal(err)
	}
	if state, err := m.LinkState(ctx); err != nil || strings.Count(state, "partitioned") != len(regions.Names) {
		t.Fatalf("link after the cut: %q, %v", state, err)
	}
	for _, r := range regions.Names {
		askLocal(ctx, t, m.GatewayURL(r), "cut-"+r)
	}
	t.Logf("answered in each region, then again with the link cut, by %v", time.Since(start).Round(time.Millisecond))

	if err := regions.Down(dir, io.Discard); err != nil {
		t.Fatalf("regions down: %v", err)
	}
	stopped = true
	t.Logf("regions down by %v", time.Since(start).Round(time.Millisecond))
	for _, p := range m.Parts {
		if p.Running() {
			t.Errorf("%s (pid %d) still runs after down", p.Name, p.Pid)
		}
		for _, port := range p.Ports {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				t.Errorf("%s's port %d still taken after down: %v", p.Name, port, err)
				continue
			}
			ln.Close()
		}
	}
}
