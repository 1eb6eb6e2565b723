package replay_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/replaytest"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

const (
	testLease = 300 * time.Millisecond
	waitLong  = 10 * time.Second
)

// countingStore counts the refreshes of the store under it.
type countingStore struct {
	replay.Store
	refreshes atomic.Int64
}

func (c *countingStore) Refresh(ctx context.Context, key string, m replay.Marker, lease time.Duration) (bool, error) {
	ok, err := c.Store.Refresh(ctx, key, m, lease)
	c.refreshes.Add(1)
	return ok, err
}

// replicas are two doors' flights over one shared store, whose clock the
// test moves (the leases' heartbeats run on real time).
func replicas(t *testing.T) (a, b *replay.Flights, clock *replaytest.Clock, store *countingStore) {
	t.Helper()
	clock = replaytest.NewClock()
	m, err := replay.NewMemory(replay.MemoryOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	store = &countingStore{Store: m}
	mk := func(group string) *replay.Flights {
		fs, err := replay.NewFlights(store, replay.FlightOptions{Lease: testLease, MaxPoll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		groupOf.Store(fs, group)
		return fs
	}
	return mk("dispatcher-a"), mk("dispatcher-b"), clock, store
}

// groupOf names the group each door's requests run as (its markers'
// Owner), one per door here: what a takeover names in Supersedes.
var groupOf sync.Map // *replay.Flights → string

func group(fs *replay.Flights) string {
	g, _ := groupOf.Load(fs)
	s, _ := g.(string)
	return s
}

func lead(t *testing.T, fs *replay.Flights, key, fp string) *replay.Lead {
	t.Helper()
	turn, err := fs.Begin(context.Background(), key, fp, group(fs))
	if err != nil || turn.Lead == nil {
		t.Fatalf("Begin = %+v, %v; want to lead", turn, err)
	}
	return turn.Lead
}

type begun struct {
	turn replay.Turn
	err  error
}

func beginAsync(ctx context.Context, fs *replay.Flights, key, fp string) <-chan begun {
	out := make(chan begun, 1)
	go func() {
		turn, err := fs.Begin(ctx, key, fp, group(fs))
		out <- begun{turn, err}
	}()
	return out
}

func await(t *testing.T, ch <-chan begun) begun {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-time.After(waitLong):
		t.Fatal("Begin never returned")
		return begun{}
	}
}

func answer(fp, body string) *replay.Answer {
	return &replay.Answer{Fingerprint: fp, Status: 200, Body: []byte(body)}
}

func TestTwinOnTheSameDoorJoinsAndIsReplayedTheAnswer(t *testing.T) {
	a, _, _, _ := replicas(t)
	l := lead(t, a, "k", "fp")
	twin := beginAsync(context.Background(), a, "k", "fp")
	eventually.True(t, waitLong, "the twin to join", func() bool { return a.Joined("k") == 1 })
	if err := l.End(context.Background(), answer("fp", "the answer"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := await(t, twin); got.err != nil || got.turn.Answer == nil || string(got.turn.Answer.Body) != "the answer" {
		t.Fatalf("twin: %+v, %v; want the answer replayed", got.turn, got.err)
	}
}

func TestTwinOnAnotherReplicaWaitsForTheLeaseAndIsReplayedTheAnswer(t *testing.T) {
	a, b, _, _ := replicas(t)
	l := lead(t, a, "k", "fp")
	twin := beginAsync(context.Background(), b, "k", "fp")
	eventually.True(t, waitLong, "the twin to wait on the other replica's lease", func() bool { return b.Waiting("k") >= 2 })
	if err := l.End(context.Background(), answer("fp", "the answer"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := await(t, twin); got.err != nil || got.turn.Answer == nil || string(got.turn.Answer.Body) != "the answer" {
		t.Fatalf("twin: %+v, %v; want the answer replayed", got.turn, got.err)
	}
}

func TestAnotherRequestUnderAKeyInFlightElsewhereIsRefused(t *testing.T) {
	a, b, _, _ := replicas(t)
	lead(t, a, "k", "fp")
	if got := await(t, beginAsync(context.Background(), b, "k", "another fp")); got.err != nil || !got.turn.Reused {
		t.Fatalf("another request: %+v, %v; want refused as reused", got.turn, got.err)
	}
	if got := await(t, beginAsync(context.Background(), a, "k", "another fp")); got.err != nil || !got.turn.Reused {
		t.Fatalf("another request on the same door: %+v, %v; want refused as reused", got.turn, got.err)
	}
}

func TestTwinAfterAFailedLeadRunsAsANewTryNotATakeover(t *testing.T) {
	a, b, _, _ := replicas(t)
	l := lead(t, a, "k", "fp")
	twin := beginAsync(context.Background(), b, "k", "fp")
	eventually.True(t, waitLong, "the twin to wait", func() bool { return b.Waiting("k") >= 1 })
	if err := l.End(context.Background(), nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	got := await(t, twin)
	if got.err != nil || got.turn.Lead == nil || got.turn.Lead.Supersedes != "" {
		t.Fatalf("twin: %+v, %v; want to lead, superseding nobody", got.turn, got.err)
	}
	_ = got.turn.Lead.End(context.Background(), nil, time.Hour)
}

func TestLeaseOfADeadLeaderLapsesAndTheRetryTakesOverNamingIt(t *testing.T) {
	a, b, clock, _ := replicas(t)
	l := lead(t, a, "k", "fp")
	l.Crash()
	retry := beginAsync(context.Background(), b, "k", "fp")
	eventually.True(t, waitLong, "the retry to wait on the live lease", func() bool { return b.Waiting("k") >= 1 })
	clock.Advance(testLease)
	got := await(t, retry)
	if got.err != nil || got.turn.Lead == nil || got.turn.Lead.Supersedes != "dispatcher-a" {
		t.Fatalf("retry: %+v, %v; want to lead, superseding dispatcher-a", got.turn, got.err)
	}
	if err := got.turn.Lead.End(context.Background(), answer("fp", "regenerated"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := await(t, beginAsync(context.Background(), a, "k", "fp")); got.turn.Answer == nil || string(got.turn.Answer.Body) != "regenerated" {
		t.Fatalf("a later retry: %+v; want the takeover's answer", got.turn)
	}
}

func TestATakeoverThatEndsWithoutAnAnswerHandsTheOrphanOn(t *testing.T) {
	a, b, clock, _ := replicas(t)
	l := lead(t, a, "k", "fp")
	l.Crash()
	clock.Advance(testLease)
	first := await(t, beginAsync(context.Background(), b, "k", "fp"))
	if first.err != nil || first.turn.Lead == nil || first.turn.Lead.Supersedes != "dispatcher-a" {
		t.Fatalf("first retry: %+v, %v; want to lead, superseding dispatcher-a", first.turn, first.err)
	}
	// Its group failed (before it met dispatcher-a's gate holding, say).
	if err := first.turn.Lead.End(context.Background(), nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	second := await(t, beginAsync(context.Background(), a, "k", "fp"))
	if second.err != nil || second.turn.Lead == nil || second.turn.Lead.Supersedes != "dispatcher-a" {
		t.Fatalf("second retry: %+v, %v; want to lead at once, superseding dispatcher-a still", second.turn, second.err)
	}
	_ = second.turn.Lead.End(context.Background(), answer("fp", "regenerated"), time.Hour)
}

func TestLeaseRefreshedByALiveLeaderIsNeverTakenOver(t *testing.T) {
	a, b, clock, store := replicas(t)
	l := lead(t, a, "k", "fp")
	defer func() { _ = l.End(context.Background(), nil, time.Hour) }()
	for range 3 {
		clock.Advance(testLease - time.Millisecond)
		n := store.refreshes.Load()
		eventually.True(t, waitLong, "the leader's heartbeat", func() bool { return store.refreshes.Load() >= n+2 }) // the second began after the advance
	}
	ctx, cancel := context.WithCancel(context.Background())
	twin := beginAsync(ctx, b, "k", "fp")
	eventually.True(t, waitLong, "the twin to wait", func() bool { return b.Waiting("k") >= 1 })
	cancel()
	if got := await(t, twin); !errors.Is(got.err, context.Canceled) || got.turn.Lead != nil {
		t.Fatalf("twin: %+v, %v; want it still waiting when its caller left", got.turn, got.err)
	}
}

// failingStore fails every call, as an unreachable Redis does.
type failingStore struct{ replay.Store }

var errDown = errors.New("store down")

func (failingStore) Get(context.Context, string) (*replay.Answer, error) { return nil, errDown }
func (failingStore) Claim(context.Context, string, replay.Marker, time.Duration) (replay.Claimed, error) {
	return replay.Claimed{}, errDown
}

func TestUnreachableStoreLeadsWithoutALeaseAndSaysWhy(t *testing.T) {
	fs, err := replay.NewFlights(failingStore{}, replay.FlightOptions{})
	if err != nil {
		t.Fatal(err)
	}
	turn, err := fs.Begin(context.Background(), "k", "fp", "d-1")
	if err != nil || turn.Lead == nil || !errors.Is(turn.Lead.StoreErr, errDown) {
		t.Fatalf("Begin = %+v, %v; want to lead, saying the store is down", turn, err)
	}
}

// An answer delivered but too large to keep leaves a tombstone in its
// place — passed by the door (over its recorder's bound) or put by End
// when the store refuses the answer (over the store's) — so the twin
// waiting on the other replica and every later retry are told NotKept at
// once and run nothing (docs/architecture.md §2).
func TestAnAnswerTooLargeToKeepLeavesATombstoneThatTwinsAndRetriesAreToldOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended *replay.Answer
	}{
		{"the door passes its tombstone", replay.NotKeptAnswer("fp")},
		{"the store refuses the answer", answer("fp", string(make([]byte, 1024)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := replay.NewMemory(replay.MemoryOptions{MaxEntryBytes: 512})
			if err != nil {
				t.Fatal(err)
			}
			flights := func(owner string) *replay.Flights {
				fs, err := replay.NewFlights(m, replay.FlightOptions{Lease: testLease, MaxPoll: 20 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				groupOf.Store(fs, owner)
				return fs
			}
			a, b := flights("dispatcher-a"), flights("dispatcher-b")
			l := lead(t, a, "k", "fp")
			twin := beginAsync(context.Background(), b, "k", "fp")
			eventually.True(t, waitLong, "the twin to wait on the other replica's lease", func() bool { return b.Waiting("k") >= 1 })
			if err := l.End(context.Background(), tc.ended, time.Hour); err != nil {
				t.Fatalf("End: %v; want the tombstone kept", err)
			}
			if got := await(t, twin); got.err != nil || !got.turn.NotKept {
				t.Fatalf("twin: %+v, %v; want told NotKept", got.turn, got.err)
			}
			for _, fs := range []*replay.Flights{a, b} {
				if got := await(t, beginAsync(context.Background(), fs, "k", "fp")); got.err != nil || !got.turn.NotKept {
					t.Fatalf("retry: %+v, %v; want told NotKept", got.turn, got.err)
				}
			}
			if got := await(t, beginAsync(context.Background(), a, "k", "another fp")); got.err != nil || !got.turn.Reused {
				t.Fatalf("another request under the key: %+v, %v; want refused as reused", got.turn, got.err)
			}
		})
	}
}

// fullStore refuses with ErrStoreFull every answer whose body is longer
// than room (tombstones have none), as a shared store at its total bound
// does, and counts its releases.
type fullStore struct {
	replay.Store
	room     int
	releases atomic.Int64
}

func (f *fullStore) Put(ctx context.Context, key string, a *replay.Answer, ttl time.Duration) error {
	if len(a.Body) > f.room || f.room < 0 {
		return replay.ErrStoreFull
	}
	return f.Store.Put(ctx, key, a, ttl)
}

func (f *fullStore) Release(ctx context.Context, key string, m replay.Marker) error {
	f.releases.Add(1)
	return f.Store.Release(ctx, key, m)
}

// A committed answer a full store refuses (its total bound,
// max_total_bytes) leaves its tombstone when that still fits, so a retry
// is told NotKept as for an answer too large to keep; when even the
// tombstone is refused the lease is released (never lapsed: no retry may
// supersede a delivered commit) and the retry runs afresh, to meet the
// winner gate. Every answer not kept is counted once, by its reason.
func TestAnAnswerTheFullStoreRefusesLeavesItsTombstoneOrReleasesTheLease(t *testing.T) {
	for _, tc := range []struct {
		name       string
		room       int // the body bytes the store still takes; -1 none
		ended      *replay.Answer
		tombstone  bool
		reason     string
		endRefused error
	}{
		{"the tombstone fits", 10, answer("fp", string(make([]byte, 1024))), true, replay.NotKeptStoreFull, nil},
		{"not even the tombstone fits", -1, answer("fp", string(make([]byte, 1024))), false, replay.NotKeptStoreFull, replay.ErrStoreFull},
		{"the door's tombstone does not fit", -1, replay.NotKeptAnswer("fp"), false, replay.NotKeptTooLarge, replay.ErrStoreFull},
		{"the answer fits", 4096, answer("fp", string(make([]byte, 1024))), false, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := replay.NewMemory(replay.MemoryOptions{})
			if err != nil {
				t.Fatal(err)
			}
			store := &fullStore{Store: m, room: tc.room}
			metrics, err := replay.NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			fs, err := replay.NewFlights(store, replay.FlightOptions{Lease: testLease, Metrics: metrics})
			if err != nil {
				t.Fatal(err)
			}
			groupOf.Store(fs, "dispatcher-a")
			l := lead(t, fs, "k", "fp")
			if err := l.End(context.Background(), tc.ended, time.Hour); !errors.Is(err, tc.endRefused) || (err == nil) != (tc.endRefused == nil) {
				t.Fatalf("End: %v; want %v", err, tc.endRefused)
			}
			got := await(t, beginAsync(context.Background(), fs, "k", "fp"))
			switch {
			case got.err != nil:
				t.Fatal(got.err)
			case tc.tombstone && !got.turn.NotKept:
				t.Fatalf("retry: %+v; want told NotKept (the tombstone)", got.turn)
			case tc.endRefused != nil && (got.turn.Lead == nil || got.turn.Lead.Supersedes != "" || store.releases.Load() != 1):
				t.Fatalf("retry: %+v after %d releases; want to lead afresh, the lease released once", got.turn, store.releases.Load())
			case tc.reason == "" && got.turn.Answer == nil:
				t.Fatalf("retry: %+v; want the answer replayed", got.turn)
			}
			if got.turn.Lead != nil {
				_ = got.turn.Lead.End(context.Background(), nil, time.Hour)
			}
			for _, r := range []string{replay.NotKeptTooLarge, replay.NotKeptStoreFull, replay.NotKeptStoreFailed, replay.NotKeptEvicted} {
				want := 0.0
				if r == tc.reason {
					want = 1
				}
				if n := metrics.NotKeptCount(r); n != want {
					t.Errorf("not kept for %s: %v; want %v", r, n, want)
				}
			}
		})
	}
}
