package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// FakeTimingsPath is where a fakellm started with timings serves them.
const FakeTimingsPath = "/timings"

// FakeTiming is one request to a fake route as its HTTP server saw it, in
// unix microseconds of the host's clock: when it arrived, when the first
// byte of its answer was written (for a stream, its first token; the
// fake writes nothing before it unless it opens streams early), when the
// server saw its client disconnect before the answer ended, and when the
// handler returned. The fake's own records (GET /stats) keep the same
// moments to the millisecond; a cancel path of a few hundred microseconds
// needs these (`make bench-path`, docs/architecture.md §12).
type FakeTiming struct {
	Seq       uint64 `json:"seq"`
	Path      string `json:"path"`
	ArrivedUs int64  `json:"arrived_unix_us"`
	// FirstWriteUs is zero when nothing of the answer was written.
	FirstWriteUs int64 `json:"first_write_unix_us,omitempty"`
	// GoneUs is zero unless the client went away before the handler
	// returned.
	GoneUs  int64 `json:"client_gone_unix_us,omitempty"`
	EndedUs int64 `json:"ended_unix_us"`
}

// FakeTimings is the body of GET /timings?since=<seq>: the retained
// timings after Since, oldest first, and the Seq to ask from next.
type FakeTimings struct {
	NextSince uint64 `json:"next_since"`
	// Dropped counts timings after Since the ring evicted before they
	// were fetched.
	Dropped uint64       `json:"dropped"`
	Timings []FakeTiming `json:"timings"`
}

// fakeTimings keeps the last timings of the POST requests a fake route
// answered in a ring and serves them at FakeTimingsPath; every other
// request passes through untimed.
type fakeTimings struct {
	next http.Handler
	now  func() time.Time

	mu   sync.Mutex
	ring []FakeTiming // seq s at ring[(s-1)%len(ring)]
	last uint64
}

// newFakeTimings wraps next, keeping the last capacity timings.
func newFakeTimings(next http.Handler, capacity int) *fakeTimings {
	return &fakeTimings{next: next, now: time.Now, ring: make([]FakeTiming, capacity)}
}

func (t *fakeTimings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == FakeTimingsPath && r.Method == http.MethodGet {
		t.serveTimings(w, r)
		return
	}
	if r.Method != http.MethodPost {
		t.next.ServeHTTP(w, r)
		return
	}
	rec := FakeTiming{Path: r.URL.Path, ArrivedUs: t.now().UnixMicro()}
	// The server cancels the request's context when it sees the client
	// go, and again once the handler has returned: a context done when
	// the handler returns is a client that went first, and the callback
	// below (its own goroutine, started at the cancel) says when. (The
	// fake itself wakes on the same Done.)
	var gone int64
	goneDone := make(chan struct{})
	stop := context.AfterFunc(r.Context(), func() {
		gone = t.now().UnixMicro()
		close(goneDone)
	})
	tw := &timedWriter{ResponseWriter: w, now: t.now}
	t.next.ServeHTTP(tw, r)
	wentFirst := r.Context().Err() != nil
	rec.FirstWriteUs, rec.EndedUs = tw.first, t.now().UnixMicro()
	if !stop() {
		<-goneDone // the callback started: let it finish before gone is read
	}
	if wentFirst {
		// The callback may be scheduled after the handler saw the same
		// cancel and returned, or not at all: the context closes its Done
		// before it starts its callbacks, and stop may come in between.
		// The earlier of the two, or the handler's end, is when it was seen.
		rec.GoneUs = rec.EndedUs
		if gone != 0 {
			rec.GoneUs = min(gone, rec.EndedUs)
		}
	}
	t.keep(rec)
}

// keep numbers rec and puts it in the ring.
func (t *fakeTimings) keep(rec FakeTiming) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	rec.Seq = t.last
	t.ring[(rec.Seq-1)%uint64(len(t.ring))] = rec
}

// since returns the retained timings after seq, oldest first.
func (t *fakeTimings) since(seq uint64) (FakeTimings, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq > t.last {
		return FakeTimings{}, fmt.Errorf("since %d is past the last timing %d (did the fake restart?)", seq, t.last)
	}
	out := FakeTimings{NextSince: t.last, Timings: []FakeTiming{}}
	first := seq + 1
	if oldest := t.last - min(t.last, uint64(len(t.ring))) + 1; first < oldest {
		out.Dropped, first = oldest-first, oldest
	}
	for s := first; s <= t.last; s++ {
		out.Timings = append(out.Timings, t.ring[(s-1)%uint64(len(t.ring))])
	}
	return out, nil
}

// serveTimings answers GET /timings?since=<seq>.
func (t *fakeTimings) serveTimings(w http.ResponseWriter, r *http.Request) {
	var seq uint64
	if s := r.URL.Query().Get("since"); s != "" {
		var err error
		if seq, err = strconv.ParseUint(s, 10, 64); err != nil {
			http.Error(w, "since: want a whole number", http.StatusBadRequest)
			return
		}
	}
	out, err := t.since(seq)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// timedWriter notes when the first byte of an answer is written. It
// unwraps to the server's writer, so http.ResponseController still finds
// its Flush, Hijack and deadlines.
type timedWriter struct {
	http.ResponseWriter
	now   func() time.Time
	first int64 // unix µs of the first Write with bytes; 0 before
}

func (w *timedWriter) Write(b []byte) (int, error) {
	if w.first == 0 && len(b) > 0 {
		w.first = w.now().UnixMicro()
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps http.Flusher for callers that assert it.
func (w *timedWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap is what http.ResponseController looks through.
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
