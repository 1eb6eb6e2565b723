package httpdoor

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// StatusPath is the door's status endpoint: readiness and, per pool,
// whether a live worker serves it (docs/architecture.md §9). It is served
// beside /readyz and /metrics, on the internal listener when there is one.
const StatusPath = "/v1/hedgerow/status"

// readyReport is the body of /readyz: whether this gateway can serve, and
// what it found of the pools' workers, which does not decide it.
type readyReport struct {
	Ready bool `json:"ready"`
	// NATS is the connection's status: "CONNECTED" when usable.
	NATS string `json:"nats"`
	// OwnWorkersMissing lists the routes of this process's own workers
	// (serve's, Options.OwnWorkers) that did not answer the ping: serve is
	// not ready without them.
	OwnWorkersMissing []string `json:"own_workers_missing,omitempty"`
	// PoolsWithoutWorkers maps each pool that no live worker serves to its
	// routes, none of which answered the ping. It is reported, never a
	// reason to be unready: requests to other pools are served, and one
	// to such a pool is answered 503 no_workers naming it.
	PoolsWithoutWorkers map[string][]string `json:"pools_without_workers,omitempty"`
	// Error says why workers could not be pinged at all.
	Error string `json:"error,omitempty"`
}

// poolStatus is one pool in the status endpoint's body.
type poolStatus struct {
	Routes []string `json:"routes"`
	// Live says a worker of at least one of its routes answered the ping.
	Live bool `json:"live"`
}

// statusReport is the body of StatusPath: readiness, and every pool.
type statusReport struct {
	readyReport
	Pools map[string]poolStatus `json:"pools"`
}

// readiness answers /readyz, the status endpoint and the pools' gauge:
// this gateway can serve while its NATS connection is up and, in serve,
// its own workers answer a ping; the same ping tells which pools have a
// live worker. Results are cached for a while and concurrent probes share
// one check, so probes and scrapes cannot flood NATS.
type readiness struct {
	nc     *nats.Conn
	wire   schemas.Wire // the region's workers are pinged, no other's
	pools  map[string][]string
	own    map[string]string // worker id → route of this process's own workers
	window time.Duration
	ttl    time.Duration
	now    func() time.Time

	mu   sync.Mutex // held across a check: concurrent probes wait for it
	at   time.Time
	last *readyReport
}

func newReadiness(nc *nats.Conn, wire schemas.Wire, pools map[string][]string, own map[string]string, window, ttl time.Duration, now func() time.Time) *readiness {
	return &readiness{nc: nc, wire: wire, pools: pools, own: own, window: window, ttl: ttl, now: now}
}

// check returns the cached report while it is fresh, else checks anew.
func (r *readiness) check() readyReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last != nil && r.now().Sub(r.at) < r.ttl {
		return *r.last
	}
	rep := r.probe()
	r.last, r.at = &rep, r.now()
	return rep
}

func (r *readiness) probe() readyReport {
	if r.nc == nil {
		return readyReport{NATS: "NOT_CONFIGURED"}
	}
	rep := readyReport{NATS: r.nc.Status().String()}
	if !r.nc.IsConnected() {
		rep.PoolsWithoutWorkers = r.poolsWithout(nil)
		return rep
	}
	live, ids, err := r.ping()
	if err != nil {
		rep.Error = err.Error()
		rep.PoolsWithoutWorkers = r.poolsWithout(nil)
		return rep
	}
	for id, rt := range r.own {
		if !ids[id] {
			rep.OwnWorkersMissing = append(rep.OwnWorkersMissing, rt)
		}
	}
	slices.Sort(rep.OwnWorkersMissing)
	rep.PoolsWithoutWorkers = r.poolsWithout(live)
	rep.Ready = len(rep.OwnWorkersMissing) == 0
	return rep
}

// poolsWithout maps each pool none of whose routes is live to its routes;
// nil when every pool has one.
func (r *readiness) poolsWithout(live map[string]bool) map[string][]string {
	var out map[string][]string
	for pool, routes := range r.pools {
		if !slices.ContainsFunc(routes, func(rt string) bool { return live[rt] }) {
			if out == nil {
				out = map[string][]string{}
			}
			out[pool] = routes
		}
	}
	return out
}

// ping pings every worker of the region and collects the routes and the
// worker ids of those that answer within the window; it stops early once
// every pool has a live route and every own worker answered.
func (r *readiness) ping() (live, ids map[string]bool, err error) {
	subject, err := micro.ControlSubject(micro.PingVerb, r.wire.WorkerServiceName(), "")
	if err != nil {
		return nil, nil, fmt.Errorf("ping subject: %w", err)
	}
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe ping replies: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, nil, fmt.Errorf("ping workers: %w", err)
	}
	live, ids = map[string]bool{}, map[string]bool{}
	// The window is a network wait, measured on the wall clock whatever the
	// injected clock says.
	deadline := time.Now().Add(r.window)
	for !r.complete(live, ids) {
		wait := time.Until(deadline)
		if wait <= 0 {
			break
		}
		msg, err := sub.NextMsg(wait)
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
			// No responders: the server says no worker of the region
			// listens at all, which is an answer, not a failure.
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("ping replies: %w", err)
		}
		var ping micro.Ping
		if json.Unmarshal(msg.Data, &ping) != nil || ping.Name != r.wire.WorkerServiceName() {
			continue
		}
		if rt := ping.Metadata["route"]; rt != "" {
			live[rt] = true
		}
		if id := ping.Metadata["worker_id"]; id != "" {
			ids[id] = true
		}
	}
	return live, ids, nil
}

// complete says the ping has heard all it needs: a live route in every
// pool and every own worker.
func (r *readiness) complete(live, ids map[string]bool) bool {
	for id := range r.own {
		if !ids[id] {
			return false
		}
	}
	return r.poolsWithout(live) == nil
}

// status is the status endpoint's body.
func (r *readiness) status() statusReport {
	rep := statusReport{readyReport: r.check(), Pools: make(map[string]poolStatus, len(r.pools))}
	for pool, routes := range r.pools {
		_, dark := rep.PoolsWithoutWorkers[pool]
		rep.Pools[pool] = poolStatus{Routes: routes, Live: !dark}
	}
	return rep
}

// poolsWithoutWorkersDesc is hedgerow_pool_without_workers{pool}: 1 while
// no live worker serves the pool as this gateway sees it (no route of it
// answered the readiness ping, or NATS is down), else 0; read at each
// scrape through the readiness cache.
var poolsWithoutWorkersDesc = prometheus.NewDesc("hedgerow_pool_without_workers",
	"1 while no live worker serves the pool (no route of it answered this gateway's ping), else 0.", []string{"pool"}, nil)

// poolCollector exports the pools' gauge from the readiness check.
type poolCollector struct{ r *readiness }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolsWithoutWorkersDesc }

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	dark := c.r.check().PoolsWithoutWorkers
	for _, pool := range slices.Sorted(maps.Keys(c.r.pools)) {
		v := 0.0
		if _, ok := dark[pool]; ok {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(poolsWithoutWorkersDesc, prometheus.GaugeValue, v, pool)
	}
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	rep := h.ready.check()
	status := http.StatusOK
	if !rep.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, rep)
}

// serveStatus answers StatusPath: always 200 (it reports; /readyz
// decides), readiness and each pool's routes and liveness.
func (h *handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, h.ready.status())
}

// NewWaiting is what a process's listeners answer while it waits at start
// for what waitingFor names ("nats", "redis"; docs/architecture.md §2,
// "Patience at start"): GET /healthz 200, since the process is alive and a
// liveness probe must not restart it into a loop; GET /readyz 503 with
// {"ready":false,"waiting_for":...}, so no traffic comes; anything else 503
// unavailable with Retry-After, in the OpenAI shape.
func NewWaiting(waitingFor func() string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusServiceUnavailable, waitingReport{WaitingFor: waitingFor()})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openAIDialect{}.writeFailure(w, &frontdoor.Failure{Code: string(schemas.ErrUnavailable), RetryAfter: time.Second,
			Message: "This process is starting: it waits for " + waitingFor() + " to answer; retry on another replica."})
	})
	return mux
}

// waitingReport is /readyz's body while the process waits at start.
type waitingReport struct {
	Ready      bool   `json:"ready"`
	WaitingFor string `json:"waiting_for"`
}
