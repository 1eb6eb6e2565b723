// Package replaytest is the conformance suite of replay.Store
// implementations: every store runs the same behaviour checks (the way
// budgets/storetest does for budget stores).
package replaytest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
)

// Clock is the settable clock the suite's stores read; the suite only
// advances it, never sleeps.
type Clock = frontdoortest.SettableClock

// NewClock returns a clock at a fixed instant.
func NewClock() *Clock { return frontdoortest.NewSettableClock() }

// Factory returns a fresh, empty store on clock that keeps entries of up
// to maxEntryBytes and, together, up to maxTotalBytes (zero: the store's
// default).
type Factory func(t *testing.T, clock *Clock, maxEntryBytes, maxTotalBytes int) replay.Store

// MaxEntry is the per-entry bound the suite asks its stores for.
const MaxEntry = 4096

// MaxTotal is the total bound the suite's bound cases ask for: room for
// ten or so of their answers, whatever a store counts beside the body.
const MaxTotal = 16 << 10

// MarkerKeep is the marker keep the suite's stores must be made with.
const MarkerKeep = time.Hour

// Run runs the suite against the stores newStore makes.
func Run(t *testing.T, newStore Factory) {
	ctx := context.Background()
	answer := func(body string) *replay.Answer {
		return &replay.Answer{Fingerprint: "fp-" + body, Status: 200,
			Header: map[string]string{"Content-Type": "text/event-stream", "X-Hedgerow-Gate": "g/a/1"}, Body: []byte(body)}
	}
	t.Run("a missing key has no answer", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		got, err := s.Get(ctx, "nothing")
		if err != nil || got != nil {
			t.Fatalf("Get = %v, %v; want nil, nil", got, err)
		}
	})
	t.Run("an answer comes back as stored, byte for byte", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		want := answer("data: {\"x\":1}\n\ndata: [DONE]\n\n")
		if err := s.Put(ctx, "k", want, time.Hour); err != nil {
			t.Fatal(err)
		}
		want.Body[0] = 'X' // the store kept its own copy
		got, err := s.Get(ctx, "k")
		if err != nil || got == nil {
			t.Fatalf("Get = %v, %v", got, err)
		}
		if string(got.Body) != "data: {\"x\":1}\n\ndata: [DONE]\n\n" || got.Status != 200 || got.Fingerprint != want.Fingerprint ||
			len(got.Header) != 2 || got.Header["X-Hedgerow-Gate"] != "g/a/1" {
			t.Fatalf("Get = %+v", got)
		}
	})
	t.Run("keys are separate and a put replaces", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		for _, kv := range [][2]string{{"a", "1"}, {"b", "2"}, {"a", "3"}} {
			if err := s.Put(ctx, kv[0], answer(kv[1]), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		for key, body := range map[string]string{"a": "3", "b": "2"} {
			if got, err := s.Get(ctx, key); err != nil || got == nil || string(got.Body) != body {
				t.Fatalf("Get(%s) = %v, %v; want body %s", key, got, err, body)
			}
		}
	})
	t.Run("an answer expires after its TTL", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock, MaxEntry, 0)
		if err := s.Put(ctx, "k", answer("x"), time.Minute); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute - time.Millisecond)
		if got, err := s.Get(ctx, "k"); err != nil || got == nil {
			t.Fatalf("Get before the TTL = %v, %v; want the answer", got, err)
		}
		clock.Advance(time.Millisecond)
		if got, err := s.Get(ctx, "k"); err != nil || got != nil {
			t.Fatalf("Get at the TTL = %v, %v; want nil", got, err)
		}
	})
	t.Run("an answer over the entry bound is refused and not kept", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		err := s.Put(ctx, "k", answer(strings.Repeat("x", MaxEntry+1)), time.Hour)
		if !errors.Is(err, replay.ErrTooLarge) {
			t.Fatalf("Put = %v; want ErrTooLarge", err)
		}
		if got, err := s.Get(ctx, "k"); err != nil || got != nil {
			t.Fatalf("Get = %v, %v; want nil", got, err)
		}
	})
	t.Run("a tombstone comes back as a tombstone and replaces the marker", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		if _, err := s.Claim(ctx, "k", replay.Marker{Fingerprint: "fp", Owner: "o", Token: "a"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, "k", replay.NotKeptAnswer("fp"), time.Hour); err != nil {
			t.Fatalf("Put of a tombstone: %v", err)
		}
		got, err := s.Get(ctx, "k")
		if err != nil || got == nil || !got.NotKept || got.Fingerprint != "fp" || len(got.Body) != 0 {
			t.Fatalf("Get = %+v, %v; want the tombstone of fp, with no body", got, err)
		}
		c, err := s.Claim(ctx, "k", replay.Marker{Fingerprint: "fp", Owner: "o", Token: "b"}, time.Minute)
		if err != nil || !c.Won || c.Orphaned != nil {
			t.Fatalf("Claim after the tombstone = %+v, %v; want won, no orphan (the tombstone replaced the marker)", c, err)
		}
		if err := s.Put(ctx, "k", answer("kept"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, "k"); err != nil || got == nil || got.NotKept {
			t.Fatalf("Get after an answer replaced the tombstone = %+v, %v; want the answer", got, err)
		}
	})
	boundSuite(t, newStore)
	markerSuite(t, newStore)
	t.Run("concurrent puts and gets are safe", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				key := string(rune('a' + i))
				for range 20 {
					if err := s.Put(ctx, key, answer(key), time.Hour); err != nil {
						t.Error(err)
						return
					}
					if got, err := s.Get(ctx, key); err != nil || got == nil || string(got.Body) != key {
						t.Errorf("Get(%s) = %v, %v", key, got, err)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// boundSuite checks the total bound (max_total_bytes): a store keeps
// answers up to it and never past it — Memory by evicting its oldest, a
// shared store by refusing new ones with ErrStoreFull —, racing Puts
// included, and takes answers again once the ones it holds expired (a
// shared store's count may hold an expired answer's bytes for a
// twenty-fourth of the TTL longer, never more).
func boundSuite(t *testing.T, newStore Factory) {
	ctx := context.Background()
	const ttl, body, puts = time.Hour, 1000, 40
	// fill Puts puts answers of body bytes under keys of prefix at once,
	// and returns the body bytes the store then holds.
	fill := func(t *testing.T, s replay.Store, prefix string) int {
		t.Helper()
		var wg sync.WaitGroup
		for i := range puts {
			wg.Go(func() {
				a := &replay.Answer{Fingerprint: "fp", Status: 200, Header: map[string]string{"Content-Type": "application/json"},
					Body: []byte(strings.Repeat("x", body))}
				if err := s.Put(ctx, prefix+strconv.Itoa(i), a, ttl); err != nil && !errors.Is(err, replay.ErrStoreFull) {
					t.Errorf("Put: %v; want nil or ErrStoreFull", err)
				}
			})
		}
		wg.Wait()
		kept := 0
		for i := range puts {
			a, err := s.Get(ctx, prefix+strconv.Itoa(i))
			if err != nil {
				t.Fatal(err)
			}
			if a != nil {
				kept += len(a.Body)
			}
		}
		return kept
	}
	t.Run("the answers kept stay within the total bound, racing puts included", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, MaxTotal)
		kept := fill(t, s, "a")
		if kept > MaxTotal || kept < MaxTotal/2 {
			t.Fatalf("%d body bytes kept of %d put; want between half the bound %d and the bound", kept, puts*body, MaxTotal)
		}
	})
	t.Run("the bound frees as the answers it holds expire", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock, MaxEntry, MaxTotal)
		fill(t, s, "a")
		clock.Advance(ttl + ttl/24)
		if kept := fill(t, s, "b"); kept < MaxTotal/2 {
			t.Fatalf("%d body bytes kept once the first answers expired; want at least half the bound %d", kept, MaxTotal)
		}
	})
}

// markerSuite checks the in-flight markers (leases) of a store.
func markerSuite(t *testing.T, newStore Factory) {
	ctx := context.Background()
	const lease = 5 * time.Second
	mark := func(token string) replay.Marker {
		return replay.Marker{Fingerprint: "fp", Owner: "owner-" + token, Token: token}
	}
	claim := func(t *testing.T, s replay.Store, key string, m replay.Marker) replay.Claimed {
		t.Helper()
		c, err := s.Claim(ctx, key, m, lease)
		if err != nil {
			t.Fatalf("Claim(%s, %s): %v", key, m.Token, err)
		}
		return c
	}
	t.Run("the first claim wins and a live marker turns the next away with its holder", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		if c := claim(t, s, "k", mark("a")); !c.Won || c.Holder != nil || c.Orphaned != nil {
			t.Fatalf("first claim = %+v; want won, no orphan", c)
		}
		c := claim(t, s, "k", mark("b"))
		if c.Won || c.Holder == nil || *c.Holder != mark("a") {
			t.Fatalf("second claim = %+v; want lost to a's marker", c)
		}
		if c := claim(t, s, "other", mark("b")); !c.Won {
			t.Fatalf("claim of another key = %+v; want won", c)
		}
	})
	t.Run("a released lease is claimed afresh, not as an orphan", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		if err := s.Release(ctx, "k", mark("b")); err != nil {
			t.Fatal(err)
		}
		if c := claim(t, s, "k", mark("c")); c.Won {
			t.Fatal("another token's release dropped a's lease")
		}
		if err := s.Release(ctx, "k", mark("a")); err != nil {
			t.Fatal(err)
		}
		if c := claim(t, s, "k", mark("c")); !c.Won || c.Orphaned != nil {
			t.Fatalf("claim after release = %+v; want won, no orphan", c)
		}
	})
	t.Run("a lease left unrefreshed lapses and its claim names the orphan", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock, MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		clock.Advance(lease - time.Millisecond)
		if c := claim(t, s, "k", mark("b")); c.Won {
			t.Fatal("a live lease was taken over")
		}
		clock.Advance(time.Millisecond)
		c := claim(t, s, "k", mark("b"))
		if !c.Won || c.Orphaned == nil || *c.Orphaned != mark("a") {
			t.Fatalf("claim at the lease's end = %+v; want won over a's orphaned marker", c)
		}
		if ok, err := s.Refresh(ctx, "k", mark("a"), lease); err != nil || ok {
			t.Fatalf("the orphan's Refresh = %v, %v; want false: its lease was taken over", ok, err)
		}
		if c := claim(t, s, "k", mark("c")); c.Won || *c.Holder != mark("b") {
			t.Fatalf("claim after the takeover = %+v; want held by b", c)
		}
	})
	t.Run("a refresh keeps the lease live", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock, MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		for range 3 {
			clock.Advance(lease - time.Second)
			if ok, err := s.Refresh(ctx, "k", mark("a"), lease); err != nil || !ok {
				t.Fatalf("Refresh = %v, %v; want true", ok, err)
			}
		}
		if c := claim(t, s, "k", mark("b")); c.Won {
			t.Fatal("a refreshed lease was taken over")
		}
	})
	t.Run("an answer replaces the marker", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		if err := s.Put(ctx, "k", &replay.Answer{Fingerprint: "fp", Status: 200, Body: []byte("x")}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Refresh(ctx, "k", mark("a"), lease); err != nil || ok {
			t.Fatalf("Refresh after the answer = %v, %v; want false", ok, err)
		}
		if c := claim(t, s, "k", mark("b")); !c.Won || c.Orphaned != nil {
			t.Fatalf("claim after the answer = %+v; want won, no orphan", c)
		}
		if a, err := s.Get(ctx, "k"); err != nil || a == nil || string(a.Body) != "x" {
			t.Fatalf("Get = %v, %v; a claim must leave the answer", a, err)
		}
	})
	t.Run("a lapsed lease is an orphan at once, and only its holder lapses it", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		if err := s.Lapse(ctx, "k", mark("b")); err != nil {
			t.Fatal(err)
		}
		if c := claim(t, s, "k", mark("c")); c.Won {
			t.Fatal("another token's lapse ended a's lease")
		}
		if err := s.Lapse(ctx, "k", mark("a")); err != nil {
			t.Fatal(err)
		}
		c := claim(t, s, "k", mark("c"))
		if !c.Won || c.Orphaned == nil || *c.Orphaned != mark("a") {
			t.Fatalf("claim after the lapse = %+v; want won over a's orphaned marker", c)
		}
	})
	t.Run("a lapse leaves the marker it was given as the orphan", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		handedBack := replay.Marker{Fingerprint: "fp", Owner: "owner-before-a", Token: "a"}
		if err := s.Lapse(ctx, "k", handedBack); err != nil {
			t.Fatal(err)
		}
		if c := claim(t, s, "k", mark("c")); !c.Won || c.Orphaned == nil || *c.Orphaned != handedBack {
			t.Fatalf("claim after the lapse = %+v; want won over the marker the lapse left, owned by owner-before-a", c)
		}
	})
	t.Run("an orphan is forgotten after the marker keep", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock, MaxEntry, 0)
		claim(t, s, "k", mark("a"))
		clock.Advance(MarkerKeep + lease)
		if c := claim(t, s, "k", mark("b")); !c.Won || c.Orphaned != nil {
			t.Fatalf("claim past the keep = %+v; want won, no orphan", c)
		}
	})
	t.Run("concurrent claims of one key elect one holder", func(t *testing.T) {
		s := newStore(t, NewClock(), MaxEntry, 0)
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range 8 {
			wg.Go(func() {
				c, err := s.Claim(ctx, "k", mark(string(rune('a'+i))), lease)
				if err != nil {
					t.Error(err)
					return
				}
				if c.Won {
					mu.Lock()
					won++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if won != 1 {
			t.Fatalf("%d claims won; want 1", won)
		}
	})
}
