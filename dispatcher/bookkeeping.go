package dispatcher

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/route"
)

// bookkeeping takes the store calls that nobody waits for off the groups'
// goroutines (docs/architecture.md §7: settles, releases and route marks are batched off
// the request path) and keeps the picker's view of the shared route flags
// and of the routes' in-flight counts across the cluster (the workers'
// leases) fresh, so an admission costs the store one round trip, not two,
// and route choice reads no store at all.
//
// Store calls run in submission order on one goroutine, except that the
// settles and releases waiting together go to the store as one EndAll (one
// round trip for all of them). When the queue is full the submitter runs
// its call itself: bookkeeping slows down, it never drops a settle.
type bookkeeping struct {
	d     *Dispatcher
	queue chan bookItem
	stop  chan struct{}
	done  sync.WaitGroup
}

// bookItem is one queued store call: call, or else the ending of the
// reservation of one of group's attempts.
type bookItem struct {
	call  func(context.Context)
	end   budgets.Ending
	group string
}

const (
	// bookkeepingQueue bounds the store calls waiting to run.
	bookkeepingQueue = 4096
	// maxEndingsPerBatch bounds one EndAll, so one round trip stays small.
	maxEndingsPerBatch = 256
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
	b := &bookkeeping{d: d, queue: make(chan bookItem, bookkeepingQueue), stop: make(chan struct{})}
	b.done.Add(2)
	go b.runCalls()
	go b.refreshRoutes()
	return b
}

// later queues a store call.
func (b *bookkeeping) later(call func(context.Context)) { b.enqueue(bookItem{call: call}) }

// end queues the settle or release of one of group's reservations.
func (b *bookkeeping) end(group string, e budgets.Ending) {
	b.enqueue(bookItem{end: e, group: group})
}

func (b *bookkeeping) enqueue(it bookItem) {
	select {
	case b.queue <- it:
	default:
		b.run([]bookItem{it})
	}
}

// run carries out items: the calls in order, then the endings among them
// as one EndAll.
func (b *bookkeeping) run(items []bookItem) {
	ctx, cancel := context.WithTimeout(context.Background(), bookkeepingTimeout)
	defer cancel()
	var ends []budgets.Ending
	var groups []string
	for _, it := range items {
		if it.call != nil {
			it.call(ctx)
			continue
		}
		ends, groups = append(ends, it.end), append(groups, it.group)
	}
	if len(ends) == 0 {
		return
	}
	for i, err := range b.d.store.EndAll(ctx, ends) {
		if err != nil {
			op := "settle"
			if ends[i].Release {
				op = "release"
			}
			b.d.log.Warn(op+" failed", "group", groups[i], "err", err)
		}
	}
}

// runCalls runs each queued item together with those queued behind it.
func (b *bookkeeping) runCalls() {
	defer b.done.Done()
	batch := make([]bookItem, 0, maxEndingsPerBatch)
	for {
		select {
		case it := <-b.queue:
			batch = append(batch[:0], it)
		case <-b.stop:
			for {
				batch = b.ready(batch[:0])
				if len(batch) == 0 {
					return
				}
				b.run(batch)
			}
		}
		b.run(b.ready(batch))
	}
}

// ready appends the items already queued to batch, up to its capacity.
func (b *bookkeeping) ready(batch []bookItem) []bookItem {
	for len(batch) < cap(batch) {
		select {
		case it := <-b.queue:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}

func (b *bookkeeping) refreshRoutes() {
	defer b.done.Done()
	names := b.d.routes
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

// syncRoutes copies the shared pushback, quarantine and ejection flags and the
// routes' in-flight counts across the cluster into the local picker until
// the next refresh is due; a refresh that fails lets them lapse, and the
// picker falls back on what this replica knows.
func (b *bookkeeping) syncRoutes(names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), routeRefreshInterval)
	defer cancel()
	states, inFlight, err := b.d.store.RouteSnapshot(ctx, names)
	if err != nil {
		return
	}
	now := b.d.now()
	until := now.Add(2 * routeRefreshInterval)
	for name, st := range states {
		rs, ok := routeStates[st]
		if !ok || rs == route.Healthy {
			continue
		}
		if cur, err := b.d.picker.Stats(name, now); err == nil && cur.State == rs && cur.Until.After(until) {
			continue // this replica's own mark lasts longer: keep it
		}
		_ = b.d.picker.SetState(name, rs, until)
		if rs == route.Ejected {
			// Another replica's ejection: this one probes the route back
			// in once it ends, as its own (docs/architecture.md §5).
			for pool, h := range b.d.health {
				if slices.Contains(b.d.pools[pool].Routes, name) {
					h.Ejected(name, until)
				}
			}
		}
	}
	for name, n := range inFlight {
		_ = b.d.picker.SetSharedInFlight(name, n, until)
	}
	for _, name := range names {
		b.d.exportRouteState(name, now)
	}
}

// close runs the queued calls and stops.
func (b *bookkeeping) close() {
	close(b.stop)
	b.done.Wait()
}
