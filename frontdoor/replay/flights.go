package replay

import "sync"

// Flights are the user actions a door is serving now, by replay key: a
// request of a key in flight waits for it rather than running again
// (docs/architecture.md §2). They are per door, never shared.
type Flights struct {
	mu sync.Mutex
	m  map[string]*Flight
}

// Flight is one request being served; requests of its key wait for Done.
type Flight struct {
	fingerprint string
	done        chan struct{}
	joined      int // under Flights.mu
}

// NewFlights returns an empty set of flights.
func NewFlights() *Flights { return &Flights{m: map[string]*Flight{}} }

// Fingerprint is the fingerprint of the flight's request.
func (f *Flight) Fingerprint() string { return f.fingerprint }

// Done is closed when the flight's leader is done (its answer stored, if
// kept).
func (f *Flight) Done() <-chan struct{} { return f.done }

// Join returns the flight of key, and whether the caller leads it (and
// must Leave it). A request that does not lead counts as joined.
func (fs *Flights) Join(key, fingerprint string) (*Flight, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		f.joined++
		return f, false
	}
	f := &Flight{fingerprint: fingerprint, done: make(chan struct{})}
	fs.m[key] = f
	return f, true
}

// Leave ends the leader's flight, after its answer is stored, and wakes
// the requests waiting for it.
func (fs *Flights) Leave(key string, f *Flight) {
	fs.mu.Lock()
	if fs.m[key] == f {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
	close(f.done)
}

// Joined is how many requests joined the flight of key now (tests watch
// it to know a twin waits).
func (fs *Flights) Joined(key string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		return f.joined
	}
	return 0
}
