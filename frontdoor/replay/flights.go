package replay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Flights are the user actions being served now, by replay key: a request
// of a key in flight waits for it rather than running again, on this door
// and — through the Store's in-flight markers — on every replica sharing
// the store (docs/architecture.md §2).
//
// A request that runs holds the key's lease (Store.Claim), refreshed every
// third of a lease while it runs and replaced by its answer (Store.Put) or
// released when it failed. A request that finds a live lease of the same
// request waits — on this door for the leader's end, on another replica by
// polling the store with backoff — and is then replayed the stored answer.
// A lease left unrefreshed for a whole lease with no answer was orphaned
// (its gateway died); the next request takes it over and runs, told which
// group's commit it may supersede (Lead.Supersedes).
type Flights struct {
	store Store
	opts  FlightOptions

	mu sync.Mutex
	m  map[string]*Flight
}

// FlightOptions configure Flights; zero values take the defaults.
type FlightOptions struct {
	// Lease is an in-flight marker's lease; zero means DefaultLease.
	Lease time.Duration
	// MaxPoll bounds the interval between two looks at a lease held on
	// another replica; zero means a tenth of the lease, at most 250 ms. The
	// first look is after MaxPoll/8; each doubles.
	MaxPoll time.Duration
	// Elsewhere is the index of the user actions other regions committed
	// (docs/architecture.md §14, "User actions across regions"): a key
	// the store does not hold is looked up there, and every committed
	// answer is published to it. Nil: the region's store alone, as in a
	// deployment of one region.
	Elsewhere Elsewhere
	// Metrics count the committed answers End could not keep (nil: none).
	Metrics *Metrics
}

// Elsewhere is what Flights ask of the user actions committed in other
// regions: their index as this region's copy holds it, and the publishing
// of this region's commits (docs/architecture.md §14). Nothing of it may
// wait on another region: Committed reads the region's own copy, Publish
// hands its entry over without waiting.
type Elsewhere interface {
	// Committed looks key up among the user actions other regions
	// committed: nil when none is known here (none committed, or its entry
	// has not replicated yet).
	Committed(ctx context.Context, key string) (*Commit, error)
	// RunAgain counts a user action committed in region that runs again
	// here, its region unheard for longer than the rerun bound.
	RunAgain(region string)
	// Publish adds this region's commit of key, with its answer a (or its
	// tombstone), to the index, kept as long as the index keeps entries
	// (the replay TTL). It does not wait for the bus; a failure is
	// counted, never returned.
	Publish(key string, a *Answer)
}

// Commit is a user action committed in another region, as the index holds
// it.
type Commit struct {
	// Region is where it was committed; Fingerprint the request's.
	Region      string
	Fingerprint string
	// Answer is the committed answer (or its tombstone) when answers
	// replicate (global.replicate_answers); nil otherwise.
	Answer *Answer
	// Unheard says Region has been silent for longer than the rerun
	// bound (global.rerun_after): the user action runs again here.
	Unheard bool
}

// Flight is one request being served on this door; requests of its key
// here wait for Done.
type Flight struct {
	fingerprint string
	done        chan struct{}
	joined      int // under Flights.mu
	waiting     int // under Flights.mu: looks at a lease held elsewhere
}

// NewFlights returns an empty set of flights over store.
func NewFlights(store Store, opts FlightOptions) (*Flights, error) {
	if store == nil {
		return nil, errors.New("replay: flights need a store")
	}
	if opts.Lease < 0 || opts.MaxPoll < 0 {
		return nil, errors.New("replay: the lease and the poll bound must not be negative")
	}
	opts.Lease = cmp.Or(opts.Lease, DefaultLease)
	opts.MaxPoll = cmp.Or(opts.MaxPoll, min(opts.Lease/10, 250*time.Millisecond))
	return &Flights{store: store, opts: opts, m: map[string]*Flight{}}, nil
}

// Turn is what a request of a key does next: exactly one field is set.
type Turn struct {
	// Answer is the committed answer of the same request: replay it.
	Answer *Answer
	// Reused says another request holds or answered the key: refuse it
	// (idempotency_key_reused).
	Reused bool
	// NotKept says the same request was answered, delivered whole, but its
	// answer was not kept — too large, or the store full — and its
	// tombstone is stored: refuse it
	// answer_not_kept, with no provider call (docs/architecture.md §2).
	NotKept bool
	// CommittedIn names the region that committed the same request when
	// its answer is not here (answers do not replicate, or not yet) and
	// the region was heard from lately: refuse it committed_in_region,
	// retryable there (docs/architecture.md §14).
	CommittedIn string
	// Lead says the request runs; the caller must End it.
	Lead *Lead
}

// Lead is a request that runs for its key: it holds the key's lease (unless
// the store failed) and this door's flight.
type Lead struct {
	// Supersedes names the group of the request of the same key that was
	// orphaned: its lease lapsed with no answer stored. That group's commit
	// of the user action may be superseded by this try
	// (docs/architecture.md §2).
	Supersedes string
	// StoreErr is the store's failure when the request leads without a
	// lease (replay is then best-effort; the winner gate still guards).
	StoreErr error
	// RunsAgain names the region whose commit of the same request this
	// one runs again, that region unheard for longer than the rerun bound
	// (docs/architecture.md §14); empty otherwise.
	RunsAgain string

	fs     *Flights
	key    string
	flight *Flight
	marker *Marker // nil without a lease
	stop   chan struct{}
	beat   sync.WaitGroup
	ended  bool
}

// Begin decides what a request of key with fingerprint fp does. It waits
// while the same request of the key is in flight, here or on a replica
// sharing the store, until that one ends (then it is replayed its answer,
// or runs itself when it failed), its lease lapses (then it takes over), or
// ctx ends (ctx's error). group names the group the request runs as if it
// leads: its marker carries it, so a takeover supersedes that group's
// commit and no other.
func (fs *Flights) Begin(ctx context.Context, key, fp, group string) (Turn, error) {
	for {
		fs.mu.Lock()
		if f, ok := fs.m[key]; ok {
			f.joined++
			fs.mu.Unlock()
			if f.fingerprint != fp {
				return Turn{Reused: true}, nil
			}
			select {
			case <-f.done:
				continue // replayed next time round, or a new try
			case <-ctx.Done():
				return Turn{}, ctx.Err()
			}
		}
		f := &Flight{fingerprint: fp, done: make(chan struct{})}
		fs.m[key] = f
		fs.mu.Unlock()
		t, err := fs.begin(ctx, key, fp, group, f)
		if t.Lead == nil {
			fs.leave(key, f)
		}
		return t, err
	}
}

// begin is Begin for the request that leads this door's flight of key: it
// looks for the answer and claims the lease, polling while another
// replica's request of the key holds it.
func (fs *Flights) begin(ctx context.Context, key, fp, group string, f *Flight) (Turn, error) {
	poll := fs.opts.MaxPoll / 8
	looked, again := false, ""
	for {
		a, err := fs.store.Get(ctx, key)
		if err == nil && a != nil {
			return answered(a, fp), nil
		}
		if !looked && fs.opts.Elsewhere != nil {
			// Once (a commit elsewhere while one runs here is not waited
			// for), and even when the store failed: another region's
			// commit is refused or replayed rather than run again.
			looked = true
			var t Turn
			if t, again = fs.elsewhere(ctx, key, fp); t != (Turn{}) {
				return t, nil
			}
		}
		if err != nil {
			return fs.degraded(ctx, key, f, err, again)
		}
		m := Marker{Fingerprint: fp, Owner: group, Token: newToken()}
		c, err := fs.store.Claim(ctx, key, m, fs.opts.Lease)
		if err != nil {
			return fs.degraded(ctx, key, f, err, again)
		}
		if c.Won {
			// An answer stored between the look and the claim is there now
			// (Put stores it before it drops the marker).
			if a, err := fs.store.Get(ctx, key); err == nil && a != nil {
				_ = fs.store.Release(context.WithoutCancel(ctx), key, m)
				return answered(a, fp), nil
			}
			l := &Lead{fs: fs, key: key, flight: f, marker: &m, stop: make(chan struct{}), RunsAgain: again}
			if o := c.Orphaned; o != nil && o.Fingerprint == fp {
				l.Supersedes = o.Owner
			}
			fs.runsAgain(again)
			l.beat.Go(l.heartbeat)
			return Turn{Lead: l}, nil
		}
		if c.Holder.Fingerprint != fp {
			return Turn{Reused: true}, nil
		}
		fs.mu.Lock()
		f.waiting++
		fs.mu.Unlock()
		wait := time.NewTimer(poll)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return Turn{}, ctx.Err()
		}
		poll = min(2*poll, fs.opts.MaxPoll)
	}
}

// degraded leads without a lease when the store failed: replay is then
// best-effort, as the winner gate still guards the user action. again
// names the region whose commit it runs again, if any.
func (fs *Flights) degraded(ctx context.Context, key string, f *Flight, err error, again string) (Turn, error) {
	if ctx.Err() != nil {
		return Turn{}, ctx.Err()
	}
	fs.runsAgain(again)
	return Turn{Lead: &Lead{fs: fs, key: key, flight: f, StoreErr: err, RunsAgain: again}}, nil
}

// runsAgain counts a lead that runs again region's commit ("" none).
func (fs *Flights) runsAgain(region string) {
	if region != "" {
		fs.opts.Elsewhere.RunAgain(region)
	}
}

// elsewhere looks key up among other regions' commits: the turn to take
// (a replay, a refusal), or none and the region whose commit runs again
// here ("" when none is known). An index that cannot be read is passed
// over, as a store that fails is: the request runs.
func (fs *Flights) elsewhere(ctx context.Context, key, fp string) (Turn, string) {
	c, err := fs.opts.Elsewhere.Committed(ctx, key)
	switch {
	case err != nil || c == nil:
		return Turn{}, ""
	case c.Fingerprint != fp:
		return Turn{Reused: true}, ""
	case c.Answer != nil:
		return answered(c.Answer, fp), ""
	case !c.Unheard:
		return Turn{CommittedIn: c.Region}, ""
	}
	return Turn{}, c.Region
}

func answered(a *Answer, fp string) Turn {
	switch {
	case a.Fingerprint != fp:
		return Turn{Reused: true}
	case a.NotKept:
		return Turn{NotKept: true}
	}
	return Turn{Answer: a}
}

// heartbeat refreshes the lease every third of it until End; a lease
// another request took over (this one was thought dead) is no longer
// refreshed.
func (l *Lead) heartbeat() {
	every := l.fs.opts.Lease / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		held, err := l.fs.store.Refresh(ctx, l.key, *l.marker, l.fs.opts.Lease)
		cancel()
		if err == nil && !held {
			return
		}
	}
}

// finish marks the request ended and stops its heartbeat; false when it
// had already ended.
func (l *Lead) finish() bool {
	if l.ended {
		return false
	}
	l.ended = true
	if l.stop != nil {
		close(l.stop)
		l.beat.Wait()
	}
	return true
}

// End ends the request: a non-nil answer is stored for ttl (replacing the
// lease) — one the store refuses as too large (ErrTooLarge) or for its
// total bound (ErrStoreFull) is replaced by its tombstone (NotKeptAnswer),
// as a door passes one for an answer over its recorder's bound, so a retry
// is refused answer_not_kept rather than run again —, else the lease is
// released so the next request of the key runs as a new try (a committed
// answer that no store kept, its tombstone included, meets the winner
// gate then); then this door's waiters wake.
// A takeover (Supersedes set) that ends without an answer hands the orphan
// on instead: its group may have failed before it ever met the orphan's
// gate holding, which then still stands, so the lease is lapsed naming the
// orphan's owner and the next request supersedes it in turn. Had the group
// cleared that holding already, superseding it again clears nothing. It
// returns the store's error for the caller to log.
func (l *Lead) End(ctx context.Context, a *Answer, ttl time.Duration) error {
	if l.ended {
		return nil
	}
	var err error
	if a != nil {
		// A committed answer that reached its caller must not look
		// orphaned: if its marker lapsed unanswered, a retry would
		// supersede the commit and the user action commit twice. So the
		// answer is stored with retries, within ctx, while the heartbeat
		// still holds the lease (a store just restarted refuses the first
		// calls of a client that saw it die).
		err = l.putRetrying(ctx, a, ttl)
		l.countNotKept(a, err)
		if (errors.Is(err, ErrTooLarge) || errors.Is(err, ErrStoreFull)) && !a.NotKept {
			a = NotKeptAnswer(a.Fingerprint)
			err = l.putRetrying(ctx, a, ttl)
		}
		if e := l.fs.opts.Elsewhere; e != nil {
			// Committed and delivered, whether or not the store kept it:
			// the other regions learn of it either way.
			e.Publish(l.key, a)
		}
	}
	l.finish()
	defer l.fs.leave(l.key, l.flight)
	if a != nil {
		if err == nil {
			return nil
		}
		err = fmt.Errorf("replay: keep the answer: %w", err)
	}
	switch {
	case l.marker == nil:
	case l.Supersedes != "":
		orphan := *l.marker
		orphan.Owner = l.Supersedes
		if lerr := l.fs.store.Lapse(ctx, l.key, orphan); lerr != nil {
			err = errors.Join(err, fmt.Errorf("replay: hand the orphan on: %w", lerr))
		}
	default:
		if rerr := l.fs.store.Release(ctx, l.key, *l.marker); rerr != nil {
			err = errors.Join(err, fmt.Errorf("replay: release the lease: %w", rerr))
		}
	}
	return err
}

// countNotKept counts the committed answer a — a tombstone when the door
// already found it over its recorder's bound — that the store's Put
// answered err, unless it was kept whole: once, by its first reason.
func (l *Lead) countNotKept(a *Answer, err error) {
	m := l.fs.opts.Metrics
	switch {
	case a.NotKept, errors.Is(err, ErrTooLarge):
		m.NotKept(NotKeptTooLarge)
	case errors.Is(err, ErrStoreFull):
		m.NotKept(NotKeptStoreFull)
	case err != nil:
		m.NotKept(NotKeptStoreFailed)
	}
}

// putRetrying stores a, retrying a Put that failed for want of the store
// with backoff (10 ms doubling to 250 ms) until it succeeds or ctx ends; an
// answer the store will not keep (ErrTooLarge, ErrStoreFull) is not
// retried. It returns the last error.
func (l *Lead) putRetrying(ctx context.Context, a *Answer, ttl time.Duration) error {
	pause := 10 * time.Millisecond
	for {
		err := l.fs.store.Put(ctx, l.key, a, ttl)
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrStoreFull) {
			return err
		}
		wait := time.NewTimer(pause)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return err
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// Orphan ends a request whose committed answer its caller never got
// whole (the caller left mid-stream): no answer is kept and the lease is
// lapsed rather than released, so the next request of the key takes it
// over at once and may supersede this dispatcher's commit, as after a
// gateway's death. Without a lease it only ends the flight.
func (l *Lead) Orphan(ctx context.Context) error {
	if !l.finish() {
		return nil
	}
	defer l.fs.leave(l.key, l.flight)
	if l.marker == nil {
		return nil
	}
	if err := l.fs.store.Lapse(ctx, l.key, *l.marker); err != nil {
		return fmt.Errorf("replay: lapse the lease: %w", err)
	}
	return nil
}

// leave ends this door's flight of key and wakes its waiters.
func (fs *Flights) leave(key string, f *Flight) {
	fs.mu.Lock()
	if fs.m[key] == f {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
	close(f.done)
}

// Joined is how many requests joined the flight of key on this door now
// (tests watch it to know a twin waits).
func (fs *Flights) Joined(key string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		return f.joined
	}
	return 0
}

// Waiting is how many times the flight of key on this door looked at a
// lease held on another replica (tests watch it to know a twin waits
// there).
func (fs *Flights) Waiting(key string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		return f.waiting
	}
	return 0
}

// newToken is a lease's own id.
func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
