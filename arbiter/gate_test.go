package arbiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakeClock is an injected clock that only moves when a test advances it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestGate(t *testing.T, ttl time.Duration) (*LocalGate, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	g, err := NewLocalGate(LocalGateOptions{TTL: ttl, Now: clock.Now})
	if err != nil {
		t.Fatalf("NewLocalGate: %v", err)
	}
	return g, clock
}

func mustClaim(t *testing.T, g Gate, ua, group string, attempt int) Claim {
	t.Helper()
	c, err := g.Claim(context.Background(), ua, group, attempt)
	if err != nil {
		t.Fatalf("Claim(%s, %s, %d): %v", ua, group, attempt, err)
	}
	return c
}

func TestLocalGateElectsExactlyOneWinnerPerUserActionUnderRace(t *testing.T) {
	const (
		claimers    = 1000
		userActions = 37 // overlapping: ~27 groups race for each user action
	)
	g, _ := newTestGate(t, time.Minute)
	claims := make([]Claim, claimers)
	errs := make([]error, claimers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ua := fmt.Sprintf("ua-%d", i%userActions)
			claims[i], errs[i] = g.Claim(context.Background(), ua, fmt.Sprintf("group-%d", i), i%3)
		}()
	}
	close(start)
	wg.Wait()

	winners := make(map[string]Claim)
	for i, c := range claims {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if !c.Won {
			continue
		}
		if prev, ok := winners[c.UserAction]; ok {
			t.Fatalf("user action %s has two winners: %s and %s", c.UserAction, prev.Value, c.Value)
		}
		winners[c.UserAction] = c
	}
	if len(winners) != userActions {
		t.Fatalf("%d user actions have a winner, want %d", len(winners), userActions)
	}
	for _, c := range claims {
		w := winners[c.UserAction]
		if c.Holder != w.Value || c.Epoch != 1 {
			t.Fatalf("claim %s/%s learned holder %q epoch %d, want %q epoch 1", c.UserAction, c.Group, c.Holder, c.Epoch, w.Value)
		}
		if !c.Won && c.Value != "" {
			t.Fatalf("losing claim carries a gate value %q", c.Value)
		}
	}
}

func TestLocalGateFirstClaimWinsAndLosersLearnTheHolder(t *testing.T) {
	g, _ := newTestGate(t, time.Minute)
	win := mustClaim(t, g, "ua", "g1", 0)
	lose := mustClaim(t, g, "ua", "g2", 1)
	if !win.Won || win.Epoch != 1 || win.Value != "g1/0/1" || win.Holder != win.Value {
		t.Fatalf("first claim = %+v, want won g1/0/1", win)
	}
	if lose.Won || lose.Holder != "g1/0/1" || lose.Epoch != 1 || lose.Value != "" {
		t.Fatalf("second claim = %+v, want lost to g1/0/1", lose)
	}
	other := mustClaim(t, g, "another-ua", "g2", 1)
	if !other.Won {
		t.Fatalf("a different user action must not be blocked: %+v", other)
	}
}

func TestLocalGateReclaimBySameAttemptIsIdempotent(t *testing.T) {
	g, _ := newTestGate(t, time.Minute)
	first := mustClaim(t, g, "ua", "g1", 2)
	again := mustClaim(t, g, "ua", "g1", 2)
	if again != first {
		t.Fatalf("reclaim = %+v, want the same claim %+v", again, first)
	}
	sibling := mustClaim(t, g, "ua", "g1", 3)
	if sibling.Won {
		t.Fatalf("another attempt of the holding group must not share the win: %+v", sibling)
	}
}

func TestLocalGateClearRemovesOnlyTheHoldersOwnClaim(t *testing.T) {
	ctx := context.Background()
	g, _ := newTestGate(t, time.Minute)
	win := mustClaim(t, g, "ua", "g1", 0)
	lose := mustClaim(t, g, "ua", "g2", 0)

	if err := g.Clear(ctx, lose); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("Clear by a loser = %v, want ErrNotHolder", err)
	}
	forged := win
	forged.Value = "g2/0/1"
	if err := g.Clear(ctx, forged); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("Clear with another value = %v, want ErrNotHolder", err)
	}
	if c := mustClaim(t, g, "ua", "g3", 0); c.Won {
		t.Fatalf("gate opened after a refused clear: %+v", c)
	}

	if err := g.Clear(ctx, win); err != nil {
		t.Fatalf("Clear by the holder: %v", err)
	}
	if err := g.Clear(ctx, win); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("second Clear = %v, want ErrNotHolder", err)
	}
	next := mustClaim(t, g, "ua", "g2", 0)
	if !next.Won {
		t.Fatalf("gate stayed closed after the holder cleared: %+v", next)
	}
	if err := g.Clear(ctx, win); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("stale clear removed the new holder: %v", err)
	}
}

func TestLocalGateEachWonClaimIncrementsTheEpoch(t *testing.T) {
	ctx := context.Background()
	g, _ := newTestGate(t, time.Minute)
	for want := int64(1); want <= 4; want++ {
		group := fmt.Sprintf("g%d", want)
		c := mustClaim(t, g, "ua", group, 0)
		if !c.Won || c.Epoch != want || c.Value != fmt.Sprintf("%s/0/%d", group, want) {
			t.Fatalf("claim %d = %+v, want won at epoch %d", want, c, want)
		}
		if err := g.Clear(ctx, c); err != nil {
			t.Fatalf("Clear: %v", err)
		}
	}
}

func TestLocalGateForgetsUserActionsAfterTheirTTL(t *testing.T) {
	const ttl = time.Minute
	g, clock := newTestGate(t, ttl)
	for i := range 100 {
		mustClaim(t, g, fmt.Sprintf("old-%d", i), "g", 0)
	}
	clock.Advance(ttl - time.Second)
	if c := mustClaim(t, g, "old-0", "late", 0); c.Won {
		t.Fatalf("winner forgotten before its TTL: %+v", c)
	}

	clock.Advance(time.Second)
	fresh := mustClaim(t, g, "new", "g", 0) // sweeps the expired entries
	if !fresh.Won {
		t.Fatalf("fresh claim = %+v", fresh)
	}
	if n := g.Len(); n != 1 {
		t.Fatalf("gate remembers %d user actions after expiry, want 1", n)
	}
	again := mustClaim(t, g, "old-7", "late", 0)
	if !again.Won || again.Epoch != 1 {
		t.Fatalf("expired user action not claimable afresh: %+v", again)
	}
	if err := g.Clear(context.Background(), Claim{UserAction: "old-8", Won: true, Value: "g/0/1"}); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("Clear of an expired claim = %v, want ErrNotHolder", err)
	}
}

func TestLocalGateStaysBoundedUnderSteadyChurn(t *testing.T) {
	const ttl = 10 * time.Second
	g, clock := newTestGate(t, ttl)
	for i := range 20_000 {
		mustClaim(t, g, fmt.Sprintf("ua-%d", i), "g", 0)
		clock.Advance(10 * time.Millisecond) // 100 claims per second
	}
	if n := g.Len(); n > 1001 {
		t.Fatalf("gate remembers %d user actions, want at most ttl × rate ≈ 1000", n)
	}
	g.mu.Lock()
	queued := len(g.expiry) - g.head
	capacity := cap(g.expiry)
	g.mu.Unlock()
	if queued > 1001 || capacity > 4*1001 {
		t.Fatalf("expiry queue holds %d items in %d slots; it must track live entries only", queued, capacity)
	}
}

func TestLocalGateRejectsInvalidClaims(t *testing.T) {
	g, _ := newTestGate(t, time.Minute)
	tests := []struct {
		name, ua, group string
		attempt         int
	}{
		{"empty user action", "", "g", 0},
		{"empty group", "ua", "", 0},
		{"negative attempt", "ua", "g", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := g.Claim(context.Background(), tt.ua, tt.group, tt.attempt); !errors.Is(err, ErrInvalidClaim) {
				t.Fatalf("Claim = %v, want ErrInvalidClaim", err)
			}
		})
	}
	if err := g.Clear(context.Background(), Claim{}); !errors.Is(err, ErrInvalidClaim) {
		t.Fatalf("Clear(zero claim) = %v, want ErrInvalidClaim", err)
	}
	if _, err := NewLocalGate(LocalGateOptions{TTL: -time.Second}); err == nil {
		t.Fatal("NewLocalGate accepted a negative TTL")
	}
}

func TestGateValueRoundTripsThroughItsTextForm(t *testing.T) {
	tests := []struct {
		text    string
		want    GateValue
		wantErr bool
	}{
		{text: "g1/0/1", want: GateValue{Group: "g1", Attempt: 0, Epoch: 1}},
		{text: "tenant/g-9/3/42", want: GateValue{Group: "tenant/g-9", Attempt: 3, Epoch: 42}},
		{text: "", wantErr: true},
		{text: "g1", wantErr: true},
		{text: "g1/0", wantErr: true},
		{text: "/0/1", wantErr: true},
		{text: "g1/x/1", wantErr: true},
		{text: "g1/-1/1", wantErr: true},
		{text: "g1/0/0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			got, err := ParseGateValue(tt.text)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseGateValue(%q) = %+v, want an error", tt.text, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseGateValue(%q) = %+v, %v; want %+v", tt.text, got, err, tt.want)
			}
			if got.String() != tt.text {
				t.Fatalf("String() = %q, want %q", got.String(), tt.text)
			}
		})
	}
}
