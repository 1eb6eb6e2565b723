package httpdoor

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
)

// readyReport is the body of /readyz: ready, or what is missing.
type readyReport struct {
	Ready bool `json:"ready"`
	// NATS is the connection's status: "CONNECTED" when usable.
	NATS string `json:"nats"`
	// PoolsWithoutWorkers maps each pool that no live worker serves to its
	// routes, none of which answered the ping.
	PoolsWithoutWorkers map[string][]string `json:"pools_without_workers,omitempty"`
	// Error says why workers could not be pinged at all.
	Error string `json:"error,omitempty"`
}

// readiness answers /readyz: the NATS connection is up and every pool has at
// least one route whose worker answers a ping. Results are cached for a
// while and concurrent probes share one check, so probes cannot flood NATS.
type readiness struct {
	nc     *nats.Conn
	wire   schemas.Wire // the region's workers are pinged, no other's
	pools  map[string][]string
	window time.Duration
	ttl    time.Duration
	now    func() time.Time

	mu   sync.Mutex // held across a check: concurrent probes wait for it
	at   time.Time
	last *readyReport
}

func newReadiness(nc *nats.Conn, wire schemas.Wire, pools map[string][]string, window, ttl time.Duration, now func() time.Time) *readiness {
	return &readiness{nc: nc, wire: wire, pools: pools, window: window, ttl: ttl, now: now}
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
		return rep
	}
	live, err := r.liveRoutes()
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	for pool, routes := range r.pools {
		if !slices.ContainsFunc(routes, func(rt string) bool { return live[rt] }) {
			if rep.PoolsWithoutWorkers == nil {
				rep.PoolsWithoutWorkers = map[string][]string{}
			}
			rep.PoolsWithoutWorkers[pool] = routes
		}
	}
	rep.Ready = rep.PoolsWithoutWorkers == nil
	return rep
}

// liveRoutes pings every worker and collects the routes of those that answer
// within the window; it stops early once every pool has one.
func (r *readiness) liveRoutes() (map[string]bool, error) {
	subject, err := micro.ControlSubject(micro.PingVerb, r.wire.WorkerServiceName(), "")
	if err != nil {
		return nil, fmt.Errorf("ping subject: %w", err)
	}
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("subscribe ping replies: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("ping workers: %w", err)
	}
	live := map[string]bool{}
	// The window is a network wait, measured on the wall clock whatever the
	// injected clock says.
	deadline := time.Now().Add(r.window)
	for !r.everyPoolLive(live) {
		wait := time.Until(deadline)
		if wait <= 0 {
			break
		}
		msg, err := sub.NextMsg(wait)
		if err == nats.ErrTimeout {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("ping replies: %w", err)
		}
		var ping micro.Ping
		if json.Unmarshal(msg.Data, &ping) != nil || ping.Name != r.wire.WorkerServiceName() {
			continue
		}
		if rt := ping.Metadata["route"]; rt != "" {
			live[rt] = true
		}
	}
	return live, nil
}

func (r *readiness) everyPoolLive(live map[string]bool) bool {
	for _, routes := range r.pools {
		if !slices.ContainsFunc(routes, func(rt string) bool { return live[rt] }) {
			return false
		}
	}
	return true
}
