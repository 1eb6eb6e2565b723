package sketchshare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// t0 is the fake clock's origin: a real date on a 10 s boundary, so test
// windows' slots start with it.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	chatStream   = delay.NewCohort("chat", "gpt4o", true, 512)
	chatNoStream = delay.NewCohort("chat", "gpt4o", false, 64)
	codeCohort   = delay.NewCohort("code", "fast", true, 2000)
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func mustEstimator(t testing.TB, cfg delay.Options) *delay.Estimator {
	t.Helper()
	e, err := delay.NewEstimator(cfg)
	if err != nil {
		t.Fatalf("NewEstimator: %v", err)
	}
	return e
}

// windowConfig is the estimators' config in most tests: a one-minute window
// of six slots, warm after 100 samples.
var windowConfig = delay.Options{Window: time.Minute, Slots: 6, WarmupSamples: 100, Max: time.Minute}

// lognormal draws a latency with the given median and σ of its log.
func lognormal(r *rand.Rand, median time.Duration, sigma float64) time.Duration {
	return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()))
}

func redisClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// replica is one dispatcher's share of the test: its estimators by class
// and its syncer.
type replica struct {
	id   string
	ests map[string]*delay.Estimator
	sync *Syncer
	x    *Exchange
}

func newReplica(t testing.TB, client redis.UniversalClient, id string, clock *fakeClock, maxAge time.Duration, classes ...string) *replica {
	t.Helper()
	x, err := NewExchange(client, ExchangeOptions{ReplicaID: id, MaxAge: maxAge})
	if err != nil {
		t.Fatalf("NewExchange: %v", err)
	}
	r := &replica{id: id, ests: map[string]*delay.Estimator{}, x: x}
	byClass := map[string]Estimator{}
	for _, class := range classes {
		r.ests[class] = mustEstimator(t, windowConfig)
		byClass[class] = r.ests[class]
	}
	if r.sync, err = NewSyncer(x, byClass, SyncerOptions{Now: clock.Now}); err != nil {
		t.Fatalf("NewSyncer: %v", err)
	}
	return r
}

func (r *replica) mustSync(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.sync.SyncOnce(ctx); err != nil {
		t.Fatalf("replica %s SyncOnce: %v", r.id, err)
	}
}

func (r *replica) delay(class string, c delay.Cohort, now time.Time) delay.Delay {
	return r.ests[class].Delay(c, now, time.Minute)
}

// feed spreads n seeded samples of cohort c over the minute from t0 between
// replicas a and b — b gets a third, and slower ones — and feeds all of
// them to the single estimator all.
func feed(t testing.TB, seed uint64, class string, c delay.Cohort, a, b *replica, all *delay.Estimator, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Minute / time.Duration(n))
		x := lognormal(r, 620*time.Millisecond, 0.4)
		target := a
		if i%3 == 0 {
			x *= 2
			target = b
		}
		if err := errors.Join(target.ests[class].ObservePrimary(c, at, x), all.ObservePrimary(c, at, x)); err != nil {
			t.Fatal(err)
		}
	}
}

func relErr(got, want time.Duration) float64 {
	return math.Abs(float64(got)-float64(want)) / float64(want)
}

var backends = []struct {
	name  string
	start func(t *testing.T) redis.UniversalClient
}{
	{"standalone", func(t *testing.T) redis.UniversalClient { return redisClient(t, redistest.Start(t).Addr()) }},
	{"cluster", func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartCluster(t).Addrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}},
}

func TestReplicasSharingOneRedisComputeTheSameDelayAsOneEstimatorOfAllSamples(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			client := be.start(t)
			hook := &redistest.RoundTrips{}
			client.AddHook(hook)
			clock := &fakeClock{t: t0}
			a := newReplica(t, client, "replica-a", clock, time.Minute, "chat", "code")
			b := newReplica(t, client, "replica-b", clock, time.Minute, "chat", "code")
			cases := []struct {
				class  string
				cohort delay.Cohort
				all    *delay.Estimator
			}{
				{"chat", chatStream, mustEstimator(t, windowConfig)},
				{"chat", chatNoStream, mustEstimator(t, windowConfig)},
				{"code", codeCohort, mustEstimator(t, windowConfig)},
			}
			for i, tc := range cases {
				feed(t, uint64(11+i), tc.class, tc.cohort, a, b, tc.all, 3000)
			}
			now := t0.Add(time.Minute - time.Millisecond) // every slot still live
			clock.Set(now)
			for _, tc := range cases {
				if own, want := a.delay(tc.class, tc.cohort, now), tc.all.Delay(tc.cohort, now, time.Minute); own.Samples >= want.Samples {
					t.Fatalf("%s before sharing: replica a has %d samples, all %d", tc.cohort, own.Samples, want.Samples)
				}
			}

			a.mustSync(t) // a publishes, finds nothing yet
			b.mustSync(t) // b publishes, merges a
			before := hook.Pipelines.Load()
			cmdsBefore := hook.Commands.Load()
			a.mustSync(t) // a merges b
			if p, c := hook.Pipelines.Load()-before, hook.Commands.Load()-cmdsBefore; p != 1 || c != 0 {
				t.Fatalf("one sync of 3 cohorts in 2 classes sent %d pipelines and %d single commands, want 1 and 0", p, c)
			}

			for _, tc := range cases {
				da, db := a.delay(tc.class, tc.cohort, now), b.delay(tc.class, tc.cohort, now)
				want := tc.all.Delay(tc.cohort, now, time.Minute)
				if da != db {
					t.Fatalf("%s: replica a's delay %+v, b's %+v; want the same", tc.cohort, da, db)
				}
				acc := tc.all.Options().RelativeAccuracy
				if !da.Warm || da.Samples != want.Samples || relErr(da.Estimate, want.Estimate) > acc {
					t.Fatalf("%s: shared delay %+v, want %+v within %v", tc.cohort, da, want, acc)
				}
			}
			if s := a.sync.Stats(); s.Rounds != 2 || s.Failures != 0 || s.CorruptPeerData != 0 {
				t.Fatalf("replica a stats = %+v, want 2 clean rounds", s)
			}
		})
	}
}

func TestCohortOnlyAPeerServedIsLearntFromTheIndex(t *testing.T) {
	client := redisClient(t, redistest.Start(t).Addr())
	clock := &fakeClock{t: t0}
	a := newReplica(t, client, "replica-a", clock, time.Minute, "chat")
	b := newReplica(t, client, "replica-b", clock, time.Minute, "chat")
	for i := range 300 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		if err := a.ests["chat"].ObservePrimary(chatNoStream, at, time.Duration(200+i)*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(30 * time.Second)
	clock.Set(now)
	a.mustSync(t)
	b.mustSync(t) // learns the cohort from the index
	if got := b.ests["chat"].Cohorts(); len(got) != 0 {
		t.Fatalf("replica b has cohorts %v before fetching any", got)
	}
	b.mustSync(t) // fetches it
	da, db := a.delay("chat", chatNoStream, now), b.delay("chat", chatNoStream, now)
	if !db.Warm || da != db {
		t.Fatalf("replica b's delay for a cohort it never served = %+v, want a's %+v", db, da)
	}
}

func TestSilentReplicaAgesOutAfterMaxAge(t *testing.T) {
	client := redisClient(t, redistest.Start(t).Addr())
	clock := &fakeClock{t: t0}
	const maxAge = 20 * time.Second // shorter than the one-minute window
	a := newReplica(t, client, "replica-a", clock, maxAge, "chat")
	b := newReplica(t, client, "replica-b", clock, maxAge, "chat")
	for i := range 100 {
		at := t0.Add(time.Duration(i) * 50 * time.Millisecond)
		for _, r := range []*replica{a, b} {
			if err := r.ests["chat"].ObservePrimary(chatStream, at, time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	key := a.x.cohortKey("chat", chatStream)
	clock.Set(t0.Add(5 * time.Second))
	b.mustSync(t)
	a.mustSync(t)
	if d := a.delay("chat", chatStream, clock.Now()); d.Samples != 200 {
		t.Fatalf("with b publishing replica a counts %d samples, want 200", d.Samples)
	}

	// b falls silent; its samples are still inside the window, but its
	// field is older than MaxAge.
	clock.Set(t0.Add(5*time.Second + maxAge + time.Second))
	a.mustSync(t)
	if d := a.delay("chat", chatStream, clock.Now()); d.Samples != 100 {
		t.Fatalf("after b went silent replica a counts %d samples, want its own 100", d.Samples)
	}
	if ok, err := client.HExists(context.Background(), key, "replica-b").Result(); err != nil || ok {
		t.Fatalf("silent replica's field still in Redis: %v, %v", ok, err)
	}
}

func TestCorruptPeerDataIsIgnoredAndCounted(t *testing.T) {
	client := redisClient(t, redistest.Start(t).Addr())
	clock := &fakeClock{t: t0}
	a := newReplica(t, client, "replica-a", clock, time.Minute, "chat")
	b := newReplica(t, client, "replica-b", clock, time.Minute, "chat")
	for i := range 100 {
		at := t0.Add(time.Duration(i) * 50 * time.Millisecond)
		for _, r := range []*replica{a, b} {
			if err := r.ests["chat"].ObservePrimary(chatStream, at, time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := t0.Add(10 * time.Second)
	clock.Set(now)
	b.mustSync(t)

	otherWidth := mustEstimator(t, delay.Options{Window: time.Minute, Slots: 3})
	_ = otherWidth.ObservePrimary(chatStream, t0, time.Second)
	badSketch := b.ests["chat"].Snapshot(chatStream, now)
	badSketch[0].Sketch = []byte{0xff, 0x01, 0x02}
	valid := encodeField(now, b.ests["chat"].Snapshot(chatStream, now))

	ctx := context.Background()
	hashKey, indexKey := a.x.cohortKey("chat", chatStream), a.x.indexKey("chat")
	tests := []struct {
		name  string
		write func() error
		undo  func() error
	}{
		{"field without a timestamp", hset(ctx, client, hashKey, "garbage"), hdel(ctx, client, hashKey)},
		{"field cut short", hset(ctx, client, hashKey, valid[:len(valid)/2]), hdel(ctx, client, hashKey)},
		{"field of another format version", hset(ctx, client, hashKey, fmt.Sprintf("%d|\x07", now.UnixMilli())), hdel(ctx, client, hashKey)},
		{"sketch bytes that do not decode", hset(ctx, client, hashKey, encodeField(now, badSketch)), hdel(ctx, client, hashKey)},
		{"snapshots of another slot width", hset(ctx, client, hashKey, encodeField(now, otherWidth.Snapshot(chatStream, t0))), hdel(ctx, client, hashKey)},
		{"index entry naming no cohort", func() error {
			return client.ZAdd(ctx, indexKey, redis.Z{Score: float64(now.UnixMilli()), Member: "not/a/cohort"}).Err()
		}, func() error { return client.ZRem(ctx, indexKey, "not/a/cohort").Err() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.write(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := tt.undo(); err != nil {
					t.Fatal(err)
				}
			}()
			before := a.sync.Stats().CorruptPeerData
			err := a.sync.SyncOnce(ctx)
			if !errors.Is(err, ErrCorruptPeerData) {
				t.Fatalf("SyncOnce = %v, want ErrCorruptPeerData", err)
			}
			if got := a.sync.Stats().CorruptPeerData - before; got != 1 {
				t.Fatalf("corrupt peer data counted %d times, want 1", got)
			}
			if d := a.delay("chat", chatStream, now); d.Samples != 200 {
				t.Fatalf("with a corrupt peer, replica a counts %d samples, want 200 (own and b's)", d.Samples)
			}
		})
	}
	a.mustSync(t) // clean again once the corrupt data is gone
}

func hset(ctx context.Context, c redis.UniversalClient, key, value string) func() error {
	return func() error { return c.HSet(ctx, key, "mallory", value).Err() }
}

func hdel(ctx context.Context, c redis.UniversalClient, key string) func() error {
	return func() error { return c.HDel(ctx, key, "mallory").Err() }
}

func TestRedisDownKeepsLocalDelaysAndSharingRecovers(t *testing.T) {
	s := redistest.Start(t)
	client := redisClient(t, s.Addr())
	clock := &fakeClock{t: t0}
	a := newReplica(t, client, "replica-a", clock, time.Minute, "chat")
	b := newReplica(t, client, "replica-b", clock, time.Minute, "chat")
	feed(t, 3, "chat", chatStream, a, b, mustEstimator(t, windowConfig), 900)
	now := t0.Add(time.Minute - time.Millisecond)
	clock.Set(now)
	a.mustSync(t)
	b.mustSync(t)
	a.mustSync(t)
	shared := a.delay("chat", chatStream, now)

	s.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := a.sync.SyncOnce(ctx)
	if err == nil || errors.Is(err, ErrCorruptPeerData) {
		t.Fatalf("SyncOnce with Redis down = %v, want a Redis error", err)
	}
	if st := a.sync.Stats(); st.Failures != 1 {
		t.Fatalf("stats after a failed sync = %+v, want 1 failure", st)
	}
	if d := a.delay("chat", chatStream, now); d != shared {
		t.Fatalf("delay with Redis down = %+v, want the last shared %+v", d, shared)
	}
	if err := a.ests["chat"].ObservePrimary(chatStream, now, 700*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := a.delay("chat", chatStream, now); d.Samples != shared.Samples+1 {
		t.Fatalf("local samples with Redis down: %d, want %d", d.Samples, shared.Samples+1)
	}

	s.Restart() // empty: like a Redis that lost its memory
	// go-redis backs off from a dead server and probes it about once a
	// second: recovery is a condition to await, bounded.
	eventually.True(t, 10*time.Second, "sharing to recover after Redis restarted", func() bool {
		return a.sync.SyncOnce(ctx) == nil
	})
	b.mustSync(t)
	a.mustSync(t)
	if da, db := a.delay("chat", chatStream, now), b.delay("chat", chatStream, now); da != db || da.Samples != shared.Samples+1 {
		t.Fatalf("after recovery a's delay %+v, b's %+v; want equal over %d samples", da, db, shared.Samples+1)
	}
}

func TestRunSyncsEveryIntervalUntilCancelled(t *testing.T) {
	client := redisClient(t, redistest.Start(t).Addr())
	x, err := NewExchange(client, ExchangeOptions{ReplicaID: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	e := mustEstimator(t, windowConfig)
	if err := e.ObservePrimary(chatStream, time.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	synced := make(chan error, 16)
	s, err := NewSyncer(x, map[string]Estimator{"chat": e}, SyncerOptions{
		Interval: 10 * time.Millisecond,
		// Syncs are frequent here, but each may take long on a loaded
		// machine under the race detector.
		Timeout: 10 * time.Second,
		AfterSync: func(err error) {
			select {
			case synced <- err:
			default: // the test needs only the first few
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	timeout := time.After(10 * time.Second)
	for range 3 {
		select {
		case err := <-synced:
			if err != nil {
				t.Fatalf("sync in Run: %v", err)
			}
		case <-timeout:
			t.Fatal("Run did not sync three times in 10s")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if n, err := client.HLen(context.Background(), x.cohortKey("chat", chatStream)).Result(); err != nil || n != 1 {
		t.Fatalf("Run published %d fields, %v; want this replica's one", n, err)
	}
}

func TestConstructorsValidateTheirConfig(t *testing.T) {
	client := redisClient(t, "127.0.0.1:1")
	exchangeTests := []struct {
		name    string
		client  redis.UniversalClient
		cfg     ExchangeOptions
		wantErr string
	}{
		{"no client", nil, ExchangeOptions{ReplicaID: "r"}, "client"},
		{"no replica id", client, ExchangeOptions{}, "replica id"},
		{"overlong replica id", client, ExchangeOptions{ReplicaID: strings.Repeat("r", 257)}, "replica id"},
		{"brace in prefix", client, ExchangeOptions{ReplicaID: "r", Prefix: "x}"}, "prefix"},
		{"negative max age", client, ExchangeOptions{ReplicaID: "r", MaxAge: -time.Second}, "max age"},
	}
	for _, tt := range exchangeTests {
		t.Run("exchange/"+tt.name, func(t *testing.T) {
			if _, err := NewExchange(tt.client, tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewExchange error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	x, err := NewExchange(client, ExchangeOptions{ReplicaID: "r"})
	if err != nil || x.maxAgeMS != delay.DefaultOptions().Window.Milliseconds() || x.prefix != DefaultPrefix {
		t.Fatalf("NewExchange defaults: %+v, %v", x, err)
	}
	e := mustEstimator(t, windowConfig)
	syncerTests := []struct {
		name    string
		x       *Exchange
		ests    map[string]Estimator
		cfg     SyncerOptions
		wantErr string
	}{
		{"no exchange", nil, nil, SyncerOptions{}, "exchange"},
		{"negative interval", x, nil, SyncerOptions{Interval: -time.Second}, "interval"},
		{"negative timeout", x, nil, SyncerOptions{Timeout: -time.Second}, "timeout"},
		{"unnamed class", x, map[string]Estimator{"": e}, SyncerOptions{}, "class"},
		{"nil estimator", x, map[string]Estimator{"chat": nil}, SyncerOptions{}, "class"},
	}
	for _, tt := range syncerTests {
		t.Run("syncer/"+tt.name, func(t *testing.T) {
			if _, err := NewSyncer(tt.x, tt.ests, tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewSyncer error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	s, err := NewSyncer(x, map[string]Estimator{"chat": e}, SyncerOptions{})
	if err != nil || s.cfg.Interval != DefaultInterval || s.cfg.Timeout != DefaultInterval {
		t.Fatalf("NewSyncer defaults: %+v, %v", s, err)
	}
}

// BenchmarkSyncOnce measures one sync of a replica with 28 warm cohorts in
// two classes against a peer publishing the same, on loopback.
func BenchmarkSyncOnce(b *testing.B) {
	client := redisClient(b, redistest.Start(b).Addr())
	clock := &fakeClock{t: t0}
	a := newReplica(b, client, "replica-a", clock, time.Minute, "chat", "code")
	peer := newReplica(b, client, "replica-b", clock, time.Minute, "chat", "code")
	r := rand.New(rand.NewPCG(1, 2))
	cohorts := 0
	for _, class := range []string{"chat", "code"} {
		for _, stream := range []bool{true, false} {
			for _, mt := range []int{0, 64, 256, 1024, 4096, 16384, 65536} {
				c := delay.NewCohort(class, "gpt4o", stream, mt)
				cohorts++
				for i := range 600 {
					at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
					for _, rep := range []*replica{a, peer} {
						_ = rep.ests[class].ObservePrimary(c, at, lognormal(r, 620*time.Millisecond, 0.4))
					}
				}
			}
		}
	}
	clock.Set(t0.Add(time.Minute - time.Millisecond))
	peer.mustSync(b)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		a.mustSync(b)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(float64(cohorts), "cohorts")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
