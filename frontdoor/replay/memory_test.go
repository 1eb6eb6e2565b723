package replay_test

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/replaytest"
)

func TestMemoryConformance(t *testing.T) {
	replaytest.Run(t, func(t *testing.T, clock *replaytest.Clock, maxEntry, maxTotal int) replay.Store {
		m, err := replay.NewMemory(replay.MemoryOptions{MaxEntryBytes: maxEntry, MaxTotalBytes: maxTotal, MarkerKeep: replaytest.MarkerKeep, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}

// The total bound evicts the oldest answers first, and expired ones before
// any live one; only live ones evicted count as answers not kept.
func TestMemoryTotalBoundEvictsOldestFirst(t *testing.T) {
	ctx := context.Background()
	clock := replaytest.NewClock()
	metrics, err := replay.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := replay.NewMemory(replay.MemoryOptions{MaxEntryBytes: 100, MaxTotalBytes: 250, Now: clock.Now, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) {
		t.Helper()
		if err := m.Put(ctx, key, &replay.Answer{Status: 200, Body: make([]byte, 99-len(key))}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	put("a")
	put("b")
	put("c") // 300 bytes would pass 250: a goes
	if got, _ := m.Get(ctx, "a"); got != nil {
		t.Fatal("a kept past the total bound")
	}
	for _, k := range []string{"b", "c"} {
		if got, _ := m.Get(ctx, k); got == nil {
			t.Fatalf("%s evicted; only the oldest should be", k)
		}
	}
	clock.Advance(time.Hour)
	put("d")
	if m.Len() != 1 {
		t.Fatalf("Len = %d after the others expired; want 1", m.Len())
	}
	if n := metrics.NotKeptCount(replay.NotKeptEvicted); n != 1 {
		t.Fatalf("%v answers counted evicted; want 1 (a; b and c expired)", n)
	}
}

func TestKeyAndFingerprintSeparateTheirParts(t *testing.T) {
	if replay.Key("t", "ab") == replay.Key("ta", "b") {
		t.Fatal("tenant and key run together")
	}
	if replay.Key("", "k") == replay.Key("other", "k") {
		t.Fatal("tenants share a key")
	}
	if replay.Fingerprint("openai", "/v1/chat/completions", []byte("{}")) == replay.Fingerprint("anthropic", "/v1/chat/completions", []byte("{}")) {
		t.Fatal("dialects share a fingerprint")
	}
}
