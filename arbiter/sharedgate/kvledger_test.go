package sharedgate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// ledgerServer runs a NATS server with JetStream on the test's own store.
func ledgerServer(t *testing.T) *server.Server {
	t.Helper()
	return natstest.Start(t, natstest.JetStream(t.TempDir()))
}

// openTestLedger opens the gate bucket on ns over a connection of its own,
// as each replica does.
func openTestLedger(t *testing.T, ns *server.Server) *KVLedger {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	l, err := OpenLedger(context.Background(), js, LedgerOptions{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("OpenLedger: %v", err)
	}
	return l
}

// fallbackReplicas are two replicas' gates over one Redis and one bucket in
// fallback mode.
func fallbackReplicas(t *testing.T, rs *redistest.Server, ns *server.Server) (*RedisGate, *RedisGate) {
	t.Helper()
	gate := func() *RedisGate {
		return newRedisGate(t, redisClient(t, rs.Addr()), RedisGateOptions{
			Timeout: 100 * time.Millisecond, OnUnavailable: UnavailableFallback, Ledger: openTestLedger(t, ns),
		})
	}
	return gate(), gate()
}

func TestLedgerProposalRules(t *testing.T) {
	ctx := context.Background()
	l := openTestLedger(t, ledgerServer(t))
	v := func(group string, attempt int, epoch int64) arbiter.GateValue {
		return arbiter.GateValue{Group: group, Attempt: attempt, Epoch: epoch}
	}
	tests := []struct {
		name string
		run  func(t *testing.T, ua string)
	}{
		{"the first proposal holds, a second loses to it", func(t *testing.T, ua string) {
			if h, won, err := l.Propose(ctx, ua, v("g1", 0, 1)); err != nil || !won || h != v("g1", 0, 1) {
				t.Fatalf("first = %v %v %v", h, won, err)
			}
			if h, won, err := l.Propose(ctx, ua, v("g2", 0, 1)); err != nil || won || h != v("g1", 0, 1) {
				t.Fatalf("second = %v %v %v; want lost to g1/0/1", h, won, err)
			}
		}},
		{"proposing the same claim again wins again", func(t *testing.T, ua string) {
			_, _, _ = l.Propose(ctx, ua, v("g1", 2, 3))
			if h, won, err := l.Propose(ctx, ua, v("g1", 2, 1)); err != nil || !won || h != v("g1", 2, 3) {
				t.Fatalf("again = %v %v %v; want the held g1/2/3", h, won, err)
			}
		}},
		{"a release lets the next claim in at a higher epoch", func(t *testing.T, ua string) {
			_, _, _ = l.Propose(ctx, ua, v("g1", 0, 4))
			if ok, err := l.Release(ctx, ua, "g1/0/4"); !ok || err != nil {
				t.Fatalf("release = %v %v", ok, err)
			}
			if _, held, _ := l.Holder(ctx, ua); held {
				t.Fatal("a released user action still has a holder")
			}
			if h, won, err := l.Propose(ctx, ua, v("g2", 0, 1)); err != nil || !won || h != v("g2", 0, 5) {
				t.Fatalf("after release = %v %v %v; want g2/0/5", h, won, err)
			}
		}},
		{"release of a value not held changes nothing", func(t *testing.T, ua string) {
			_, _, _ = l.Propose(ctx, ua, v("g1", 0, 1))
			if ok, err := l.Release(ctx, ua, "g2/0/1"); ok || err != nil {
				t.Fatalf("release of another's value = %v %v", ok, err)
			}
			if h, held, _ := l.Holder(ctx, ua); !held || h != v("g1", 0, 1) {
				t.Fatalf("holder = %v %v; want g1/0/1", h, held)
			}
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, fmt.Sprintf("ua-%d", i)) })
	}
}

func TestLedgerElectsOneWinnerUnderRace(t *testing.T) {
	ns := ledgerServer(t)
	ledgers := []*KVLedger{openTestLedger(t, ns), openTestLedger(t, ns), openTestLedger(t, ns)}
	const userActions, claimants = 50, 6
	var mu sync.Mutex
	winners := map[string][]string{}
	var wg sync.WaitGroup
	for ua := range userActions {
		for c := range claimants {
			wg.Go(func() {
				key := fmt.Sprintf("ua-%d", ua)
				h, won, err := ledgers[c%len(ledgers)].Propose(context.Background(), key, arbiter.GateValue{Group: fmt.Sprintf("g%d", c), Epoch: 1})
				if err != nil {
					t.Errorf("propose: %v", err)
					return
				}
				if won {
					mu.Lock()
					winners[key] = append(winners[key], h.String())
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for ua := range userActions {
		if w := winners[fmt.Sprintf("ua-%d", ua)]; len(w) != 1 {
			t.Fatalf("user action %d has winners %q, want exactly one", ua, w)
		}
	}
}

// A fallback gate never elects two winners of one user action: not while
// Redis is down, not after it restarted empty, not when the replicas saw
// different Redis states.
func TestFallbackGateNeverCommitsAUserActionTwice(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// before runs against the first replica, between runs the outage,
		// and the second replica's claim of the same user action must lose
		// to the first's holder.
		before, between func(rs *redistest.Server)
	}{
		{"redis down for both", func(rs *redistest.Server) { rs.Kill() }, func(*redistest.Server) {}},
		{"redis restarted empty after the commit", func(*redistest.Server) {}, func(rs *redistest.Server) { rs.Kill(); rs.Restart() }},
		{"decided while redis was down, asked again once it is back", func(rs *redistest.Server) { rs.Kill() }, func(rs *redistest.Server) { rs.Restart() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := redistest.Start(t)
			g1, g2 := fallbackReplicas(t, rs, ledgerServer(t))
			tt.before(rs)
			first, err := g1.Claim(ctx, "ua", "g1", 0)
			if err != nil || !first.Won {
				t.Fatalf("first claim = %+v, %v; want a win", first, err)
			}
			tt.between(rs)
			second := claimUntilDecided(t, g2, "ua", "g2")
			if second.Won || second.Holder != first.Value {
				t.Fatalf("second replica's claim = %+v; want lost to %s", second, first.Value)
			}
		})
	}
}

// claimUntilDecided claims until an answer comes without error: a restarted
// Redis refuses the first calls of a client that saw it die.
func claimUntilDecided(t *testing.T, g *RedisGate, ua, group string) arbiter.Claim {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := g.Claim(context.Background(), ua, group, 0)
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim of %s by %s: %v", ua, group, err)
		}
	}
}

func TestFallbackGateTeachesAnEmptyRedisTheLedgersHolder(t *testing.T) {
	ctx := context.Background()
	rs := redistest.Start(t)
	g1, g2 := fallbackReplicas(t, rs, ledgerServer(t))
	first := mustClaim(t, g1, "ua", "g1", 0)
	rs.Kill()
	rs.Restart()
	second := claimUntilDecided(t, g2, "ua", "g2")
	if second.Won {
		t.Fatalf("claim after an empty restart won: %+v", second)
	}
	if got := redisHolds(t, redisClient(t, rs.Addr()), g2, "ua"); got != first.Value {
		t.Fatalf("Redis holds %q after the ledger decided, want %q", got, first.Value)
	}
	// A clear releases the ledger's holding too: the next claim wins, at an
	// epoch above the cleared one.
	if err := g1.Clear(ctx, first); err != nil {
		t.Fatalf("Clear: %v", err)
	}
	third := mustClaim(t, g2, "ua", "g3", 0)
	if v, _ := arbiter.ParseGateValue(third.Value); !third.Won || v.Epoch <= first.Epoch {
		t.Fatalf("claim after clear = %+v; want a win above epoch %d", third, first.Epoch)
	}
}

func TestGateWithoutRedisRefusesOrDecidesAsConfigured(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name        string
		mode        Unavailable
		stopLedger  bool
		wantErr     error
		wantDecided bool
	}{
		{"local keeps the local decision", UnavailableLocal, false, arbiter.ErrGateDegraded, true},
		{"refuse decides nothing", UnavailableRefuse, false, arbiter.ErrGateUnavailable, false},
		{"fallback lets the ledger decide", UnavailableFallback, false, nil, true},
		{"fallback with no ledger either refuses", UnavailableFallback, true, arbiter.ErrGateUnavailable, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := redistest.Start(t)
			ns := ledgerServer(t)
			cfg := RedisGateOptions{Timeout: 100 * time.Millisecond, OnUnavailable: tt.mode}
			if tt.mode == UnavailableFallback {
				cfg.Ledger = openTestLedger(t, ns)
				cfg.Ledger.timeout = 200 * time.Millisecond
			}
			g := newRedisGate(t, redisClient(t, rs.Addr()), cfg)
			rs.Kill()
			if tt.stopLedger {
				ns.Shutdown()
			}
			c, err := g.Claim(ctx, "ua", "g1", 0)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("claim err = %v, want %v", err, tt.wantErr)
			}
			if c.Won != tt.wantDecided {
				t.Fatalf("claim = %+v; decided = %v, want %v", c, c.Won, tt.wantDecided)
			}
			if !tt.wantDecided {
				// Nothing was kept: the local gate lets another group claim
				// again (and be refused the same way), not lose to a ghost.
				if c2, err := g.Claim(ctx, "ua", "g2", 0); c2.Holder != "" || !errors.Is(err, arbiter.ErrGateUnavailable) {
					t.Fatalf("second claim = %+v, %v; want refused again, no holder", c2, err)
				}
			}
		})
	}
}

// A Redis win the ledger cannot confirm is refused and given back: Redis
// does not keep a holder that never committed.
func TestARedisWinTheLedgerCannotConfirmIsRefusedAndGivenBack(t *testing.T) {
	ctx := context.Background()
	rs := redistest.Start(t)
	ns := ledgerServer(t)
	l := openTestLedger(t, ns)
	l.timeout = 200 * time.Millisecond
	client := redisClient(t, rs.Addr())
	g := newRedisGate(t, client, RedisGateOptions{Timeout: 100 * time.Millisecond, OnUnavailable: UnavailableFallback, Ledger: l})
	// Another replica won and cleared the user action once: Redis' epoch
	// is ahead of this replica's local one, so the two values differ.
	other := newRedisGate(t, client, RedisGateOptions{Timeout: 100 * time.Millisecond, OnUnavailable: UnavailableFallback, Ledger: openTestLedger(t, ns)})
	if err := other.Clear(ctx, mustClaim(t, other, "ua", "g0", 0)); err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	if c, err := g.Claim(ctx, "ua", "g1", 0); !errors.Is(err, arbiter.ErrGateUnavailable) || c.Won {
		t.Fatalf("claim with the ledger down = %+v, %v; want refused", c, err)
	}
	if got := redisHolds(t, client, g, "ua"); got != "" {
		t.Fatalf("Redis still holds %q for a refused claim", got)
	}
	// Nor does the local gate: another group of this replica is refused
	// the same way, not lost to a holder that never committed.
	if c, err := g.Claim(ctx, "ua", "g2", 0); !errors.Is(err, arbiter.ErrGateUnavailable) || c.Holder != "" {
		t.Fatalf("second claim = %+v, %v; want refused again, no holder", c, err)
	}
}

func TestNewRedisGateTiesTheLedgerToFallbackMode(t *testing.T) {
	client := redisClient(t, redistest.Start(t).Addr())
	l := openTestLedger(t, ledgerServer(t))
	for _, cfg := range []RedisGateOptions{
		{OnUnavailable: UnavailableFallback},
		{OnUnavailable: UnavailableLocal, Ledger: l},
		{OnUnavailable: "maybe"},
	} {
		if _, err := NewRedisGate(client, cfg); err == nil {
			t.Errorf("NewRedisGate(%+v) accepted", cfg)
		}
	}
	if _, err := ParseUnavailable("refuse"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseUnavailable("sometimes"); err == nil {
		t.Fatal("ParseUnavailable accepted sometimes")
	}
}
