package sharedgate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// redisClient is a client of one server that honours context deadlines, as
// NewRedisGate requires.
func redisClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newRedisGate(t testing.TB, client redis.UniversalClient, cfg RedisGateOptions) *RedisGate {
	t.Helper()
	g, err := NewRedisGate(client, cfg)
	if err != nil {
		t.Fatalf("NewRedisGate: %v", err)
	}
	return g
}

// redisHolds returns what Redis holds as the winner of userAction ("" when
// nothing), read with a plain GET.
func redisHolds(t *testing.T, client redis.UniversalClient, g *RedisGate, userAction string) string {
	t.Helper()
	v, err := client.Get(context.Background(), g.keys(userAction)[0]).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatalf("GET winner of %s: %v", userAction, err)
	}
	return v
}

func redisEpoch(t *testing.T, client redis.UniversalClient, g *RedisGate, userAction string) int64 {
	t.Helper()
	n, err := client.Get(context.Background(), g.keys(userAction)[1]).Int64()
	if err != nil {
		t.Fatalf("GET epoch of %s: %v", userAction, err)
	}
	return n
}

// gateBackends are the Redis deployments every shared-gate rule is checked
// against: one server, and a three-master cluster.
var gateBackends = []struct {
	name  string
	start func(t *testing.T) redis.UniversalClient
}{
	{"standalone", func(t *testing.T) redis.UniversalClient { return redisClient(t, redistest.Start(t).Addr()) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return clusterClient(t, redistest.StartCluster(t).Addrs()) }},
}

func TestRedisGateSharedElectionRules(t *testing.T) {
	for _, be := range gateBackends {
		t.Run(be.name, func(t *testing.T) {
			client := be.start(t)
			// Two replicas: each its own RedisGate and LocalGate, one Redis.
			r1 := newRedisGate(t, client, RedisGateOptions{Timeout: MaxRedisGateTimeout})
			r2 := newRedisGate(t, client, RedisGateOptions{Timeout: MaxRedisGateTimeout})

			t.Run("FirstClaimWinsAcrossReplicasAndLosersLearnTheHolder", func(t *testing.T) {
				ua := "ua-first"
				win := mustClaim(t, r1, ua, "gA", 0)
				if !win.Won || win.Epoch != 1 || win.Value != "gA/0/1" || win.Holder != win.Value {
					t.Fatalf("first claim = %+v, want won gA/0/1", win)
				}
				lose := mustClaim(t, r2, ua, "gB", 0)
				if lose.Won || lose.Holder != "gA/0/1" || lose.Epoch != 1 || lose.Value != "" {
					t.Fatalf("other replica's claim = %+v, want lost to gA/0/1", lose)
				}
				// r2 released its local win on losing in Redis: a later claim
				// there asks Redis again and names the same holder.
				again := mustClaim(t, r2, ua, "gC", 1)
				if again.Won || again.Holder != "gA/0/1" {
					t.Fatalf("later claim on the losing replica = %+v, want lost to gA/0/1", again)
				}
				if got := redisHolds(t, client, r1, ua); got != win.Value {
					t.Fatalf("Redis holds %q, want the winner's %q", got, win.Value)
				}
			})

			t.Run("ReclaimBySameGroupAndAttemptIsIdempotentOnAnyReplica", func(t *testing.T) {
				ua := "ua-reclaim"
				first := mustClaim(t, r1, ua, "gA", 2)
				if again := mustClaim(t, r1, ua, "gA", 2); again != first {
					t.Fatalf("reclaim on the same replica = %+v, want %+v", again, first)
				}
				if other := mustClaim(t, r2, ua, "gA", 2); other != first {
					t.Fatalf("reclaim through another replica = %+v, want %+v", other, first)
				}
				if sibling := mustClaim(t, r1, ua, "gA", 3); sibling.Won {
					t.Fatalf("another attempt of the holding group shares the win: %+v", sibling)
				}
				if e := redisEpoch(t, client, r1, ua); e != 1 {
					t.Fatalf("epoch after re-claims = %d, want 1: a re-claim is no new election", e)
				}
			})

			t.Run("EpochIncrementsPerWonClaimAndSurvivesClear", func(t *testing.T) {
				ua := "ua-epoch"
				ctx := context.Background()
				for i := int64(1); i <= 4; i++ {
					r := []*RedisGate{r1, r2}[i%2]
					c := mustClaim(t, r, ua, fmt.Sprintf("g%d", i), 0)
					if !c.Won || c.Epoch != i || c.Value != fmt.Sprintf("g%d/0/%d", i, i) {
						t.Fatalf("claim %d = %+v, want won at epoch %d", i, c, i)
					}
					if err := r.Clear(ctx, c); err != nil {
						t.Fatalf("Clear by the holder: %v", err)
					}
					if got := redisHolds(t, client, r, ua); got != "" {
						t.Fatalf("after Clear Redis still holds %q", got)
					}
					if e := redisEpoch(t, client, r, ua); e != i {
						t.Fatalf("epoch after clear = %d, want %d", e, i)
					}
				}
			})

			t.Run("CompareAndDeleteNeverDeletesAnothersValue", func(t *testing.T) {
				ua := "ua-clear"
				ctx := context.Background()
				win := mustClaim(t, r1, ua, "gA", 0)
				lose := mustClaim(t, r2, ua, "gB", 0)
				forgedGroup, forgedEpoch := win, win
				forgedGroup.Value = "gB/0/1"
				forgedEpoch.Value = "gA/0/2"
				for name, c := range map[string]arbiter.Claim{"loser": lose, "forged group": forgedGroup, "stale epoch": forgedEpoch} {
					for _, r := range []*RedisGate{r1, r2} {
						if err := r.Clear(ctx, c); !errors.Is(err, arbiter.ErrNotHolder) {
							t.Fatalf("Clear by %s = %v, want ErrNotHolder", name, err)
						}
					}
					if got := redisHolds(t, client, r1, ua); got != win.Value {
						t.Fatalf("after Clear by %s Redis holds %q, want %q", name, got, win.Value)
					}
				}
				if c := mustClaim(t, r2, ua, "gC", 0); c.Won {
					t.Fatalf("gate opened after refused clears: %+v", c)
				}
				if err := r1.Clear(ctx, win); err != nil {
					t.Fatalf("Clear by the holder: %v", err)
				}
				if err := r1.Clear(ctx, win); !errors.Is(err, arbiter.ErrNotHolder) {
					t.Fatalf("second Clear = %v, want ErrNotHolder", err)
				}
				next := mustClaim(t, r2, ua, "gB", 1)
				if !next.Won || next.Epoch != 2 {
					t.Fatalf("claim after the clear = %+v, want won at epoch 2", next)
				}
			})

			t.Run("UserActionIDsCannotBreakTheHashTag", func(t *testing.T) {
				// Each id must get keys of its own, both in one slot (a
				// cluster answers CROSSSLOT otherwise).
				ids := []string{"a}b", "a%7Db", "{x}", "x", "a:b}:win", "}{", "%"}
				for _, ua := range ids {
					if c := mustClaim(t, r1, ua, "g", 0); !c.Won || c.Epoch != 1 {
						t.Fatalf("claim of id %q = %+v, want a fresh win", ua, c)
					}
				}
				for _, ua := range ids {
					if got := redisHolds(t, client, r1, ua); got != "g/0/1" {
						t.Fatalf("id %q: Redis holds %q, want g/0/1", ua, got)
					}
				}
			})

			t.Run("ElectsExactlyOneWinnerPerUserActionUnder10000ConcurrentClaims", func(t *testing.T) {
				electUnderRace(t, client, r1, r2)
			})
		})
	}
}

// electUnderRace sends 10,000 seeded claims over overlapping user actions
// through two replicas at once and checks that each user action has exactly
// one winning value, the one Redis holds, which every claim names.
func electUnderRace(t *testing.T, client redis.UniversalClient, r1, r2 *RedisGate) {
	const (
		claims      = 10_000
		userActions = 250 // ~40 claims race for each
		workers     = 32  // per replica
	)
	type job struct {
		gate    *RedisGate
		ua      string
		group   string
		attempt int
	}
	rng := rand.New(rand.NewPCG(5, 11))
	jobs := make([]job, claims)
	for i := range jobs {
		jobs[i] = job{
			gate:  []*RedisGate{r1, r2}[rng.IntN(2)],
			ua:    fmt.Sprintf("race-%d", rng.IntN(userActions)),
			group: fmt.Sprintf("g%d", rng.IntN(6)), attempt: rng.IntN(2),
		}
	}
	results := make([]arbiter.Claim, claims)
	errs := make([]error, claims)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 2 * workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				results[i], errs[i] = j.gate.Claim(context.Background(), j.ua, j.group, j.attempt)
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()

	winner := map[string]string{}
	for i, c := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if !c.Won {
			continue
		}
		if w, ok := winner[c.UserAction]; ok && w != c.Value {
			t.Fatalf("user action %s has two winners: %s and %s", c.UserAction, w, c.Value)
		}
		winner[c.UserAction] = c.Value
	}
	if len(winner) != userActions {
		t.Fatalf("%d user actions have a winner, want %d", len(winner), userActions)
	}
	for ua, w := range winner {
		if got := redisHolds(t, client, r1, ua); got != w {
			t.Fatalf("user action %s: winner's value %q, Redis holds %q", ua, w, got)
		}
	}
	for i, c := range results {
		w := winner[c.UserAction]
		if c.Holder != w || c.Epoch != 1 {
			t.Fatalf("claim %d (%s %s/%d) learned holder %q epoch %d, want %q epoch 1",
				i, c.UserAction, c.Group, c.Attempt, c.Holder, c.Epoch, w)
		}
		if v, _ := arbiter.ParseGateValue(w); c.Won != (v.Group == c.Group && v.Attempt == c.Attempt) {
			t.Fatalf("claim %d (%s/%d) won=%v against holder %s", i, c.Group, c.Attempt, c.Won, w)
		}
	}
}

// degradeMargin is the scheduling slack allowed on top of the gate's Timeout
// before a degraded claim counts as late: the tests share two cores with
// others and run under the race detector.
const degradeMargin = 250 * time.Millisecond

func TestRedisGateKeepsTheLocalDecisionWhenRedisIsDownAndRecovers(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	client := redisClient(t, s.Addr())
	const timeout = 50 * time.Millisecond
	g := newRedisGate(t, client, RedisGateOptions{Timeout: timeout})
	if c := mustClaim(t, g, "before", "gA", 0); !c.Won {
		t.Fatalf("claim with Redis up = %+v", c)
	}

	s.Kill()
	start := time.Now()
	c, err := g.Claim(ctx, "during", "gA", 0)
	elapsed := time.Since(start)
	if !errors.Is(err, arbiter.ErrGateDegraded) {
		t.Fatalf("Claim with Redis down: err = %v, want ErrGateDegraded", err)
	}
	if elapsed > timeout+degradeMargin {
		t.Fatalf("degraded Claim took %v, want within the %v timeout", elapsed, timeout)
	}
	if v, perr := arbiter.ParseGateValue(c.Value); !c.Won || perr != nil || v.Group != "gA" || c.Holder != c.Value {
		t.Fatalf("degraded claim = %+v, want the local win of gA with a gate value", c)
	}
	// The local decision stands: another group loses at once, without error.
	if lose, err := g.Claim(ctx, "during", "gB", 0); err != nil || lose.Won || lose.Holder != c.Value {
		t.Fatalf("local loser with Redis down = %+v, %v; want lost to %s", lose, err, c.Value)
	}
	// Clear degrades too, but frees the local entry.
	if err := g.Clear(ctx, c); !errors.Is(err, arbiter.ErrGateDegraded) {
		t.Fatalf("Clear with Redis down = %v, want ErrGateDegraded", err)
	}
	if again, err := g.Claim(ctx, "during", "gB", 0); !again.Won || !errors.Is(err, arbiter.ErrGateDegraded) {
		t.Fatalf("claim after a degraded clear = %+v, %v; want a degraded local win", again, err)
	}

	s.Restart()
	// go-redis backs off from a dead server and probes it about once a
	// second, so recovery is awaited as a condition, each try on a fresh
	// user action.
	tries := 0
	eventually.True(t, 10*time.Second, "claims to go through Redis again after a restart", func() bool {
		ua := fmt.Sprintf("after-%d", tries)
		tries++
		c, err := g.Claim(ctx, ua, "gA", 0)
		if err == nil {
			if !c.Won || c.Value != "gA/0/1" || redisHolds(t, client, g, ua) != c.Value {
				t.Fatalf("claim after restart = %+v, Redis holds %q", c, redisHolds(t, client, g, ua))
			}
			return true
		}
		if !errors.Is(err, arbiter.ErrGateDegraded) {
			t.Fatalf("claims did not go through Redis again after a restart: %v", err)
		}
		return false
	})
}

// TestRedisGateTimeoutBoundsAClaimWhenRedisStalls points the gate at a
// server that accepts connections and never answers — a hung Redis, unlike a
// dead one, refuses nothing.
func TestRedisGateTimeoutBoundsAClaimWhenRedisStalls(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})

	client := redisClient(t, l.Addr().String())
	const timeout = 50 * time.Millisecond
	g := newRedisGate(t, client, RedisGateOptions{Timeout: timeout})
	start := time.Now()
	c, err := g.Claim(context.Background(), "stalled", "gA", 0)
	elapsed := time.Since(start)
	if !errors.Is(err, arbiter.ErrGateDegraded) || !c.Won {
		t.Fatalf("Claim against a stalled Redis = %+v, %v; want the local win and ErrGateDegraded", c, err)
	}
	if elapsed > timeout+degradeMargin {
		t.Fatalf("Claim against a stalled Redis took %v, want within the %v timeout", elapsed, timeout)
	}
}

func TestRedisGateRejectsInvalidClaimsWithoutADecision(t *testing.T) {
	g := newRedisGate(t, redisClient(t, redistest.Start(t).Addr()), RedisGateOptions{})
	tests := []struct {
		name, ua, group string
		attempt         int
	}{
		{"no user action", "", "g", 0},
		{"no group", "ua", "", 0},
		{"negative attempt", "ua", "g", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := g.Claim(context.Background(), tt.ua, tt.group, tt.attempt); !errors.Is(err, arbiter.ErrInvalidClaim) {
				t.Fatalf("Claim = %v, want ErrInvalidClaim", err)
			}
		})
	}
	if err := g.Clear(context.Background(), arbiter.Claim{Group: "g", Won: true, Value: "g/0/1"}); !errors.Is(err, arbiter.ErrInvalidClaim) {
		t.Fatalf("Clear without a user action = %v, want ErrInvalidClaim", err)
	}
}

func TestNewRedisGateValidatesItsConfig(t *testing.T) {
	good := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	noCtx := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = good.Close(); _ = noCtx.Close() })
	tests := []struct {
		name    string
		client  redis.UniversalClient
		cfg     RedisGateOptions
		wantErr string
	}{
		{"defaults", good, RedisGateOptions{}, ""},
		{"no client", nil, RedisGateOptions{}, "client is required"},
		{"client ignores context deadlines", noCtx, RedisGateOptions{}, "ContextTimeoutEnabled"},
		{"brace in prefix", good, RedisGateOptions{Prefix: "a{b"}, "must not contain"},
		{"negative ttl", good, RedisGateOptions{TTL: -time.Second}, "ttl"},
		{"sub-millisecond ttl", good, RedisGateOptions{TTL: time.Microsecond}, "ttl"},
		{"negative timeout", good, RedisGateOptions{Timeout: -time.Millisecond}, "timeout"},
		{"unbounded timeout", good, RedisGateOptions{Timeout: MaxRedisGateTimeout + 1}, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewRedisGate(tt.client, tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewRedisGate: %v", err)
				}
				if g.timeout != DefaultRedisGateTimeout || g.ttlMS != arbiter.DefaultGateTTL.Milliseconds() || g.prefix != DefaultRedisGatePrefix || g.Local() == nil {
					t.Fatalf("defaults not applied: %+v", g)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewRedisGate error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestRedisGateKeysKeepEveryIDInsideOneHashTag(t *testing.T) {
	g := newRedisGate(t, redisClient(t, "127.0.0.1:1"), RedisGateOptions{})
	seen := map[string]string{}
	for _, ua := range []string{"plain", "a}b", "a%7Db", "a%257Db", "{x}", "}{", "a:b}:win"} {
		keys := g.keys(ua)
		win, epoch := keys[0], keys[1]
		// Redis hashes the text between the first '{' and the next '}'.
		tag := func(k string) string {
			i := strings.IndexByte(k, '{')
			j := strings.IndexByte(k[i+1:], '}')
			return k[i+1 : i+1+j]
		}
		if tag(win) != tag(epoch) || tag(win) != "ua:"+escapeKeyPart(ua) {
			t.Fatalf("id %q: tags %q and %q, want both ua:%s", ua, tag(win), tag(epoch), escapeKeyPart(ua))
		}
		if other, dup := seen[win]; dup {
			t.Fatalf("ids %q and %q share the key %s", other, ua, win)
		}
		seen[win] = ua
	}
}

// BenchmarkRedisGateClaim measures a winning claim — local CAS plus one
// script round trip — on loopback, reporting the latency percentiles.
// BenchmarkRedisGateClaim times an uncontested won claim, Redis alone
// (local) beside Redis confirmed by the JetStream ledger (fallback), in one
// run so the two compare as a ratio.
func BenchmarkRedisGateClaim(b *testing.B) {
	rs := redistest.Start(b)
	for _, mode := range []Unavailable{UnavailableLocal, UnavailableFallback} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := RedisGateOptions{Prefix: "bench-" + string(mode), Timeout: MaxRedisGateTimeout, OnUnavailable: mode}
			if mode == UnavailableFallback {
				js, err := jetstream.New(natstest.Connect(b, natstest.Start(b, natstest.JetStream(b.TempDir()))))
				if err != nil {
					b.Fatal(err)
				}
				if cfg.Ledger, err = OpenLedger(context.Background(), js, LedgerOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			g := newRedisGate(b, redisClient(b, rs.Addr()), cfg)
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				c, err := g.Claim(ctx, fmt.Sprintf("bench-%d", i), "g", 0)
				lat = append(lat, time.Since(start))
				if err != nil || !c.Won {
					b.Fatalf("claim %d = %+v, %v", i, c, err)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
		})
	}
}
