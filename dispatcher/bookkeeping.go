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
// fresh, so an admission costs the store one round trip, not two.
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
	// routeRefreshInterval is how often shared route flags are read; a flag
	// another replica set reaches this one's primaries within it.
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
		b.syncRouteStates(names)
		select {
		case <-tick.C:
		case <-b.stop:
			return
		}
	}
}

// syncRouteStates copies the shared pushback and quarantine flags into the
// local picker until the next refresh is due.
func (b *bookkeeping) syncRouteStates(names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), routeRefreshInterval)
	defer cancel()
	states, err := b.d.store.RouteStates(ctx, names)
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
}

// close runs the queued calls and stops.
func (b *bookkeeping) close() {
	close(b.stop)
	b.done.Wait()
}
