// Package regions runs two hedgerow regions on one host from binaries
// (`make regions`, `hedgerow regions up|down|status|link`;
// docs/architecture.md §12 and §14): east and west, each its own
// nats-server (JetStream, TLS, the region's per-role users from
// internal/natsauth), its own Redis, a worker and a gateway, the two
// joined as a NATS supercluster whose gateway links pass through fault
// proxies (internal/tools/faultproxy) that delay them (80 ms each way by
// default) and can cut and heal them; the simulated routes (fakellm) are
// shared. Global ceilings are split into regional leases (global:).
//
// It is built from internal/tools/cluster's parts and process handling:
// Up returns once every part is ready, everything it starts is written
// down in the state directory, and Down stops exactly that.
package regions

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/cluster"
)

// Names are the regions, in start order; the first holds the leases'
// bucket (global.authority.placement).
var Names = []string{"east", "west"}

// Ports are the ports of every part, all on 127.0.0.1, one per region
// (in the order of Names) unless said otherwise.
type Ports struct {
	NATS        []int `json:"nats"`
	NATSRoute   []int `json:"nats_route"`
	NATSMonitor []int `json:"nats_monitor"`
	// Link is where a region's nats-server takes gateway links; LinkProxy
	// the fault proxy in front of it, which the other region dials (the
	// server advertises it), and LinkControl that proxy's control API.
	Link        []int `json:"link"`
	LinkProxy   []int `json:"link_proxy"`
	LinkControl []int `json:"link_control"`
	Redis       []int `json:"redis"`
	// HTTP is a gateway's API, /readyz and /metrics.
	HTTP          []int `json:"http"`
	WorkerMetrics []int `json:"worker_metrics"`
	// FakeLLM is one port per route (cluster.Routes), shared.
	FakeLLM []int `json:"fakellm"`
}

// DefaultPorts are the fixed ports of `make regions`, clear of 4222 and
// 6379 and of `make cluster`'s: NATS clients 4231 and 4232 (routes 6231,
// 6232; monitoring 8231, 8232), gateway links 7231 and 7232 behind their
// proxies 7241 and 7242 (control 7251, 7252), Redis 6391 and 6392,
// gateways 8281 and 8282, workers' metrics 9281 and 9282, routes
// 9211–9213.
func DefaultPorts() Ports {
	return Ports{
		NATS: []int{4231, 4232}, NATSRoute: []int{6231, 6232}, NATSMonitor: []int{8231, 8232},
		Link: []int{7231, 7232}, LinkProxy: []int{7241, 7242}, LinkControl: []int{7251, 7252},
		Redis: []int{6391, 6392}, HTTP: []int{8281, 8282}, WorkerMetrics: []int{9281, 9282},
		FakeLLM: []int{9211, 9212, 9213},
	}
}

// FreePorts picks ports the kernel says are free (tests; never the fixed
// ports).
func FreePorts() (Ports, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	take := func(n int) []int {
		var out []int
		for range n {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil
			}
			lns = append(lns, ln)
			out = append(out, ln.Addr().(*net.TCPAddr).Port)
		}
		return out
	}
	r := len(Names)
	p := Ports{NATS: take(r), NATSRoute: take(r), NATSMonitor: take(r), Link: take(r), LinkProxy: take(r), LinkControl: take(r),
		Redis: take(r), HTTP: take(r), WorkerMetrics: take(r), FakeLLM: take(len(cluster.Routes))}
	if len(p.all()) != len(p.perRegion())*r+len(cluster.Routes) {
		return Ports{}, errors.New("regions: could not take enough free ports")
	}
	return p, nil
}

func (p Ports) perRegion() [][]int {
	return [][]int{p.NATS, p.NATSRoute, p.NATSMonitor, p.Link, p.LinkProxy, p.LinkControl, p.Redis, p.HTTP, p.WorkerMetrics}
}

// all lists every port.
func (p Ports) all() []int {
	var out []int
	for _, ports := range p.perRegion() {
		out = append(out, ports...)
	}
	return append(out, p.FakeLLM...)
}

// Tenant limits of the one tenant, "local": a global rate split into
// the regions' leases, and a global spend limit leased as allowances.
const (
	TenantRate = 40 // requests a second over both regions
	// SpendLimit is in units (tokens) a day over both regions: about
	// 800,000 of the routes' requests, so that runs of make chaos-regions
	// on kept Redis data (about 1,300 units a request) do not exhaust it.
	SpendLimit = 1_000_000_000
	// RouteRequestsPerMinute is every route's requests_per_minute, held
	// over both regions.
	RouteRequestsPerMinute = 6000
)

// GlobalCeilings are the kinds held across regions.
var GlobalCeilings = []string{"tenant_rate", "tenant_spend", "route_requests", "pool_reserve"}

// DefaultDelay is the link's delay each way.
const DefaultDelay = 80 * time.Millisecond

// Spec is what Up starts.
type Spec struct {
	// Dir is the state directory: configurations, credentials, logs, pid
	// files, data.
	Dir string
	// Binaries.
	Hedgerow, NATSServer, RedisServer string
	Ports                             Ports
	// Delay is the link's delay each way at start.
	Delay time.Duration
	// TimeScale slows (above 1) or speeds the simulated routes.
	TimeScale float64
}

// Default is `make regions`' spec in dir with the binaries given.
func Default(dir, hedgerow, natsServer, redisServer string) Spec {
	return Spec{Dir: dir, Hedgerow: hedgerow, NATSServer: natsServer, RedisServer: redisServer,
		Ports: DefaultPorts(), Delay: DefaultDelay, TimeScale: 1}
}

func (s Spec) validate() error {
	switch {
	case s.Dir == "":
		return errors.New("regions: no state directory")
	case s.Hedgerow == "" || s.NATSServer == "" || s.RedisServer == "":
		return errors.New("regions: the hedgerow, nats-server and redis-server binaries are needed")
	case len(s.Ports.FakeLLM) != len(cluster.Routes):
		return fmt.Errorf("regions: one port per route (%d)", len(cluster.Routes))
	case s.Delay < 0:
		return errors.New("regions: a negative link delay")
	}
	for _, ports := range s.Ports.perRegion() {
		if len(ports) != len(Names) {
			return fmt.Errorf("regions: one port per region (%d) of each kind", len(Names))
		}
	}
	seen := map[int]bool{}
	for _, port := range s.Ports.all() {
		if port <= 0 || seen[port] {
			return fmt.Errorf("regions: port %d is missing or used twice", port)
		}
		seen[port] = true
	}
	return nil
}

// Part names.
func natsName(region string) string { return "nats-" + region }

// RedisName names a region's Redis.
func RedisName(region string) string { return "redis-" + region }

// GatewayName names a region's gateway.
func GatewayName(region string) string { return "gateway-" + region }

// WorkerName names a region's worker.
func WorkerName(region string) string { return "worker-" + region }

// LinkName names the proxy in front of a region's gateway links.
func LinkName(region string) string { return "link-to-" + region }

// authDir is a region's natsauth directory in the state directory.
func authDir(dir, region string) string { return filepath.Join(dir, "nats-auth", region) }
