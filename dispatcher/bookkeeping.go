package dispatcher

import (
	"context"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/route"
)

// bookkeeping takes the store calls that nobody waits for off the groups'
// goroutines (DESIGN §7: settles, releases and route marks are batched off
// the request path) and keeps the picker's view of the shared route flags
// and of the routes' in-flight counts across the cluster (the workers'
// leases) fresh, so an admission costs the store one round trip, not two,
// and route choice reads no store at all.
//
// Store calls run in submission order on one goroutine. When the queue is
// full the submitter runs the call itself: bookkeeping slows down, it never
// drops a settle.
type bookkeeping struct {
	d     *Dispatcher
	queue chan func(context.Context)
	stop  chan struct{}
	done  sync.WaitGroup
}

const (
	// bookkeepingQueue bounds the store calls waiting to run.
	bookkeepingQueue = 4096
	// routeRefreshInterval is how often shared route flags and in-flight
	// counts are read; a flag another replica set, or a load other
	// replicas' attempts put on a route, reaches this one's primaries
	// within it.
	routeRefreshInterval = 250 * time.Millisecond
	// bookkeepingTimeout bounds one store call, so a hung store cannot keep
	// Close waiting.
	bookkeepingTimeout = 2 * time.Second
)

func startBookkeeping(d *Dispatcher) *bookkeeping {
	b := &bookkeeping{d: d, queue: make(chan func(context.Context), bookkeepingQueue), stop: make(chan struct{})}
	b.done.Add(2)
	go b.runCalls()
	go b.refreshRoutes()
	return b
}

// later queues a store call.
func (b *bookkeeping) later(call func(context.Context)) {
	select {
	case b.queue <- call:
	default:
		b.run(call)
	}
}

func (b *bookkeeping) run(call func(context.Context)) {
	ctx, cancel := context.WithTimeout(context.Background(), bookkeepingTimeout)
	defer cancel()
	call(ctx)
}

func (b *bookkeeping) runCalls() {
	defer b.done.Done()
	for {
		select {
		case call := <-b.queue:
			b.run(call)
		case <-b.stop:
			for {
				select {
				case call := <-b.queue:
					b.run(call)
				default:
					return
				}
			}
		}
	}
}

func (b *bookkeeping) refreshRoutes() {
	defer b.done.Done()
	names := make([]string, 0, len(b.d.cfg.Routes))
	for _, r := range b.d.cfg.Routes {
		names = append(names, r.Name)
	}
	tick := time.NewTicker(routeRefreshInterval)
	defer tick.Stop()
	for {
		b.syncRoutes(names)
		select {
		case <-tick.C:
		case <-b.stop:
			return
		}
	}
}

// syncRoutes copies the shared pushback and quarantine flags and the
// routes' in-flight counts across the cluster into the local picker until
// the next refresh is due; a refresh that fails lets them lapse, and the
// picker falls back on what this replica knows.
func (b *bookkeeping) syncRoutes(names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), routeRefreshInterval)
	defer cancel()
	states, inFlight, err := b.readRoutes(ctx, names)
	if err != nil {
		return
	}
	until := b.d.now().Add(2 * routeRefreshInterval)
	for name, st := range states {
		switch st {
		case budgets.RoutePushback:
			_ = b.d.picker.SetState(name, route.Pushback, until)
		case budgets.RouteQuarantined:
			_ = b.d.picker.SetState(name, route.Quarantined, until)
		}
	}
	for name, n := range inFlight {
		_ = b.d.picker.SetSharedInFlight(name, n, until)
	}
}

// routeSnapshotter is a store that reads route flags and in-flight leases
// in one round trip, as the Redis store does.
type routeSnapshotter interface {
	RouteSnapshot(ctx context.Context, routes []string) (map[string]budgets.RouteState, map[string]int, error)
}

// readRoutes reads the routes' flags and in-flight counts: one call to a
// routeSnapshotter, else RouteStates then InFlight. Counts that cannot be
// read leave the flags good (and the counts nil).
func (b *bookkeeping) readRoutes(ctx context.Context, names []string) (map[string]budgets.RouteState, map[string]int, error) {
	if s, ok := b.d.store.(routeSnapshotter); ok {
		return s.RouteSnapshot(ctx, names)
	}
	states, err := b.d.store.RouteStates(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	inFlight, err := b.d.store.InFlight(ctx, names)
	if err != nil {
		return states, nil, nil
	}
	return states, inFlight, nil
}

// close runs the queued calls and stops.
func (b *bookkeeping) close() {
	close(b.stop)
	b.done.Wait()
}
