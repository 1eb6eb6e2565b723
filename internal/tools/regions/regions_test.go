package regions

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/tools/cluster"
)

// The fixed ports stay clear of the machine's own NATS and Redis and of
// make cluster's.
func TestTheFixedPortsAreClearOfTheMachinesServicesAndOfMakeCluster(t *testing.T) {
	taken := []int{4222, 6379}
	c := cluster.DefaultPorts()
	for _, ports := range [][]int{c.NATS, c.NATSRoute, c.NATSMonitor, c.Gateways, c.GatewayInternal, c.WorkerMetrics, c.FakeLLM,
		{c.Redis, c.RedisProxy, c.RedisProxyControl, c.Prometheus}} {
		taken = append(taken, ports...)
	}
	s := Default(t.TempDir(), "/bin/true", "/bin/true", "/bin/true")
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	for _, port := range s.Ports.all() {
		if slices.Contains(taken, port) {
			t.Errorf("port %d is the machine's or make cluster's", port)
		}
	}
	if s.Ports.HTTP[0] != 8281 || s.Ports.HTTP[1] != 8282 {
		t.Errorf("gateways on %v, want east on 8281 and west on 8282", s.Ports.HTTP)
	}
}

// Each region's configurations load for their roles, name the region and
// its global ceilings, and each region's nats-server reads its file: its
// gateway advertises its own proxy and dials the other region's.
func TestEachRegionsConfigurationsLoadAndItsLinksGoThroughTheProxies(t *testing.T) {
	ports, err := FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	s := Spec{Dir: t.TempDir(), Hedgerow: "/bin/true", NATSServer: "/bin/true", RedisServer: "/bin/true", Ports: ports, Delay: DefaultDelay}
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Spec: s}
	if err := m.plan(); err != nil {
		t.Fatal(err)
	}
	env := func(string) (string, bool) { return "k", true }
	for i, r := range Names {
		for _, c := range []struct {
			file string
			role config.Role
		}{{GatewayName(r) + ".yaml", config.RoleGateway}, {WorkerName(r) + ".yaml", config.RoleWorker}} {
			cfg, err := config.Load(filepath.Join(s.Dir, c.file), c.role, env)
			if err != nil {
				t.Fatalf("%s: %v", c.file, err)
			}
			if cfg.Deployment.Region != r || !slices.Equal(cfg.Global.Regions, Names) || !cfg.GlobalCeiling("tenant_rate") {
				t.Errorf("%s: region %q, global %+v", c.file, cfg.Deployment.Region, cfg.Global)
			}
		}
		opts, err := server.ProcessConfigFile(filepath.Join(s.Dir, natsName(r)+".conf"))
		if err != nil {
			t.Fatalf("nats-server cannot read %s's configuration: %v", r, err)
		}
		other := 1 - i
		g := opts.Gateway
		if g.Name != r || g.Port != ports.Link[i] || g.Advertise != cluster.Addr(ports.LinkProxy[i]) || g.TLSConfig == nil || g.Username != natsauth.GatewayUser {
			t.Errorf("%s's gateway: %+v", r, g)
		}
		if len(g.Gateways) != 1 || g.Gateways[0].Name != Names[other] || len(g.Gateways[0].URLs) != 1 ||
			g.Gateways[0].URLs[0].Port() != strconv.Itoa(ports.LinkProxy[other]) {
			t.Errorf("%s dials %+v, want %s through its proxy", r, g.Gateways, Names[other])
		}
		if !opts.JetStream || opts.Cluster.Name != r {
			t.Errorf("%s: JetStream %v, cluster %q", r, opts.JetStream, opts.Cluster.Name)
		}
	}
	for _, name := range []string{LinkName("east"), RedisName("west"), GatewayName("west"), "fakellm-fake-a"} {
		if _, ok := m.Part(name); !ok {
			t.Errorf("no part %s", name)
		}
	}
}
