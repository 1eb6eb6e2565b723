// Package cluster runs a local, production-shaped hedgerow deployment from
// binaries, without containers (`make cluster`, `hedgerow cluster up|down`;
// docs/architecture.md §12, "The local cluster and the fault suite"): a
// three-node nats-server cluster with JetStream, per-role users and TLS
// from internal/natsauth, Redis with AOF, simulated routes (fakellm),
// workers, gateway replicas sharing Redis (the first one through a
// faultproxy, so the fault suite can cut it off), and Prometheus scraping
// the hedgerow processes.
//
// Up starts every part in the background and returns once each is ready;
// everything it starts is written down in the state directory (a pid file
// per part, a manifest with each part's command line), so Down stops
// exactly what Up started and a test or an operator can kill or restart one
// part by name.
package cluster

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
)

// Ports are the ports of every part, all on 127.0.0.1.
type Ports struct {
	NATS        []int `json:"nats"`         // client ports, one per node
	NATSRoute   []int `json:"nats_route"`   // cluster route ports
	NATSMonitor []int `json:"nats_monitor"` // monitoring (healthz) ports
	Redis       int   `json:"redis"`
	// RedisProxy is the faultproxy in front of Redis that the first
	// gateway goes through; RedisProxyControl its control API.
	RedisProxy        int   `json:"redis_proxy"`
	RedisProxyControl int   `json:"redis_proxy_control"`
	Gateways          []int `json:"gateways"`         // the API, plain HTTP
	GatewayInternal   []int `json:"gateway_internal"` // /readyz and /metrics
	WorkerMetrics     []int `json:"worker_metrics"`
	FakeLLM           []int `json:"fakellm"` // one per route
	Prometheus        int   `json:"prometheus"`
}

// DefaultPorts are the fixed ports of `make cluster`: NATS clients on
// 4223–4225 (routes 6223–6225, monitoring 8223–8225), Redis on 6380 (its
// proxy 6381, control 6382), gateways on 8081 and 8082 (internal 9181,
// 9182), workers' metrics 9191 and 9192, routes 9111–9113, Prometheus 9090.
func DefaultPorts() Ports {
	return Ports{
		NATS: []int{4223, 4224, 4225}, NATSRoute: []int{6223, 6224, 6225}, NATSMonitor: []int{8223, 8224, 8225},
		Redis: 6380, RedisProxy: 6381, RedisProxyControl: 6382,
		Gateways: []int{8081, 8082}, GatewayInternal: []int{9181, 9182},
		WorkerMetrics: []int{9191, 9192}, FakeLLM: []int{9111, 9112, 9113},
		Prometheus: 9090,
	}
}

// FreePorts picks ports the kernel says are free, for a cluster of
// natsNodes nodes, gateways gateways and workers workers (tests; never the
// fixed ports). withPrometheus false leaves Prometheus out (port 0).
func FreePorts(natsNodes, gateways, workers int, withPrometheus bool) (Ports, error) {
	var p Ports
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	take := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0
		}
		lns = append(lns, ln)
		return ln.Addr().(*net.TCPAddr).Port
	}
	for range natsNodes {
		p.NATS = append(p.NATS, take())
		p.NATSRoute = append(p.NATSRoute, take())
		p.NATSMonitor = append(p.NATSMonitor, take())
	}
	p.Redis, p.RedisProxy, p.RedisProxyControl = take(), take(), take()
	for range gateways {
		p.Gateways = append(p.Gateways, take())
		p.GatewayInternal = append(p.GatewayInternal, take())
	}
	for range workers {
		p.WorkerMetrics = append(p.WorkerMetrics, take())
	}
	for range Routes {
		p.FakeLLM = append(p.FakeLLM, take())
	}
	if withPrometheus {
		p.Prometheus = take()
	}
	if len(lns) != len(p.all()) {
		return Ports{}, errors.New("cluster: could not take enough free ports")
	}
	return p, nil
}

// all lists every port in use.
func (p Ports) all() []int {
	out := append([]int{}, p.NATS...)
	out = append(out, p.NATSRoute...)
	out = append(out, p.NATSMonitor...)
	out = append(out, p.Redis, p.RedisProxy, p.RedisProxyControl)
	out = append(out, p.Gateways...)
	out = append(out, p.GatewayInternal...)
	out = append(out, p.WorkerMetrics...)
	out = append(out, p.FakeLLM...)
	if p.Prometheus != 0 {
		out = append(out, p.Prometheus)
	}
	return out
}

// Routes are the simulated routes, one fakellm each, in pool Pool.
var Routes = []string{"fake-a", "fake-b", "fake-c"}

// Pool is the pool the routes serve; requests name it as their model.
const Pool = "general"

// TenantKey is the API key of the cluster's one tenant, "local".
const TenantKey = "local-dev-key"

// Spec is what Up starts.
type Spec struct {
	// Dir is the state directory: configurations, credentials, logs, pid
	// files, data.
	Dir string
	// Binaries. Prometheus empty runs none.
	Hedgerow, NATSServer, RedisServer, Prometheus string
	// Alerts is a Prometheus rule file loaded, and required to load,
	// when set.
	Alerts string
	// Workers and Gateways count the processes of each (each worker
	// serves every route); the NATS nodes are len(Ports.NATS).
	Workers, Gateways int
	Ports             Ports
	// TimeScale slows (above 1) or speeds the simulated routes.
	TimeScale float64
}

// Default is `make cluster`'s spec in dir with the binaries given: three
// NATS nodes, two workers, two gateways, the fixed ports.
func Default(dir, hedgerow, natsServer, redisServer, prometheus string) Spec {
	return Spec{Dir: dir, Hedgerow: hedgerow, NATSServer: natsServer, RedisServer: redisServer, Prometheus: prometheus,
		Workers: 2, Gateways: 2, Ports: DefaultPorts(), TimeScale: 1}
}

func (s Spec) validate() error {
	p := s.Ports
	switch {
	case s.Dir == "":
		return errors.New("cluster: no state directory")
	case s.Hedgerow == "" || s.NATSServer == "" || s.RedisServer == "":
		return errors.New("cluster: the hedgerow, nats-server and redis-server binaries are needed")
	case len(p.NATS) == 0 || len(p.NATSRoute) != len(p.NATS) || len(p.NATSMonitor) != len(p.NATS):
		return errors.New("cluster: one client, route and monitor port per NATS node")
	case s.Gateways < 1 || len(p.Gateways) != s.Gateways || len(p.GatewayInternal) != s.Gateways:
		return errors.New("cluster: one API and one internal port per gateway")
	case s.Workers < 1 || len(p.WorkerMetrics) != s.Workers:
		return errors.New("cluster: one metrics port per worker")
	case len(p.FakeLLM) != len(Routes):
		return fmt.Errorf("cluster: one port per route (%d)", len(Routes))
	case s.Prometheus != "" && p.Prometheus == 0:
		return errors.New("cluster: Prometheus needs a port")
	}
	seen := map[int]bool{}
	for _, port := range p.all() {
		if port <= 0 || seen[port] {
			return fmt.Errorf("cluster: port %d is missing or used twice", port)
		}
		seen[port] = true
	}
	return nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Names of the parts.
func natsName(i int) string    { return "nats-" + strconv.Itoa(i+1) }
func gatewayName(i int) string { return "gateway-" + strconv.Itoa(i+1) }
func workerName(i int) string  { return "worker-" + strconv.Itoa(i+1) }
func fakeName(route string) string {
	return "fakellm-" + route
}

// Part names that are not numbered.
const (
	RedisName      = "redis"
	ProxyName      = "redis-proxy"
	PrometheusName = "prometheus"
)

// NATSName, GatewayName and WorkerName name the i-th (from 0) part.
func NATSName(i int) string { return natsName(i) }

// GatewayName names the i-th gateway (from 0).
func GatewayName(i int) string { return gatewayName(i) }

// WorkerName names the i-th worker (from 0).
func WorkerName(i int) string { return workerName(i) }

// PidFile is the pid file of part name in dir.
func PidFile(dir, name string) string { return filepath.Join(dir, name+".pid") }

// LogFile is the log of part name in dir.
func LogFile(dir, name string) string { return filepath.Join(dir, "logs", name+".log") }
