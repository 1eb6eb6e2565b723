package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/arbiter/sharedgate"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/budgets/slice/redisslice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// These tests run dispatcher replicas that share one real redis-server
// (docs/architecture.md §6, §7): budgets and the winner gate hold across them.

// redisClient is a client of rs that never retries and honours deadlines,
// as the gateway builds it.
func redisClient(t testing.TB, rs *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisShared is one replica's view of rs: a Redis store and gate under
// prefix, as internal/node assembles them.
func redisShared(t testing.TB, client redis.UniversalClient, prefix string) (budgets.Store, arbiter.Gate) {
	t.Helper()
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := sharedgate.NewRedisGate(client, sharedgate.RedisGateOptions{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return store, gate
}

// requestPathStore sends the calls a group waits for (Admit, ReserveExtra)
// to one store and the bookkeeping calls nobody waits for (settles, route
// refreshes) to another over a separate client, so the first client's
// round trips are exactly the request path's.
type requestPathStore struct {
	budgets.Store // bookkeeping
	requestPath   budgets.Store
}

func (s requestPathStore) Admit(ctx context.Context, r budgets.AdmitRequest) (budgets.Admission, error) {
	return s.requestPath.Admit(ctx, r)
}

func (s requestPathStore) ReserveExtra(ctx context.Context, r budgets.ExtraRequest) (budgets.Grant, error) {
	return s.requestPath.ReserveExtra(ctx, r)
}

// The round trips to Redis a group waits for, at the steady state, with
// the gateway's store as internal/node assembles it (budgets.Sliced over
// the Redis store, the slices granted by redisslice): a user action with
// no Idempotency-Key is the gateway's alone and makes no budget round
// trip; one with a key asks Redis for its ledger (docs/architecture.md §7
// "Round trips on the request path").
func TestRequestPathRoundTripsToRedis(t *testing.T) {
	rs := redistest.Start(t)
	stall := func() *script {
		// Its primaries (the warm-up's and the measured one) stall.
		return newScript(behaviour{words: 2}, behaviour{hang: true}, behaviour{words: 2}, behaviour{hang: true})
	}
	tests := []struct {
		name           string
		script         *script
		idempotencyKey bool
		hedged         bool
		min, max       int64
	}{
		{"an unhedged group without a key: election only", newScript(behaviour{words: 2}), false, false, 1, 1},
		{"an unhedged group with a key: admission and election", newScript(behaviour{words: 2}), true, false, 2, 2},
		{"a hedged group without a key: election only", stall(), false, true, 1, 1},
		{"a hedged group with a key: admission, hedge budget and election", stall(), true, true, 3, 4},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := twoRoutes(t, tt.script)
			counted := &redistest.RoundTrips{}
			requestClient := redisClient(t, rs)
			requestClient.AddHook(counted)
			prefix := fmt.Sprintf("roundtrips%d", i)
			bookkeeping, _ := redisShared(t, redisClient(t, rs), prefix)
			requestPath, gate := redisShared(t, requestClient, prefix)
			granter, err := redisslice.New(requestClient, redisslice.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			// No background round during the test, so every granter call
			// counted is one a request waited for.
			slices := slicetest.Slices(t, granter, time.Now)
			store := budgets.NewSliced(requestPathStore{Store: bookkeeping, requestPath: requestPath}, slices, nil)
			d := c.addDispatcher(Options{Store: store, Gate: gate})
			submission := func(n int) Submission {
				sub := Submission{Pool: "general", Request: chat(false)}
				if tt.idempotencyKey {
					sub.IdempotencyKey = fmt.Sprintf("roundtrips-%d-%d", i, n)
				}
				return sub
			}
			// Warm up: the first use of each script loads it (EVALSHA, then
			// EVAL), the first calls dial and the first hedge fills the
			// pool's reserve slice; the target is the steady state.
			warm, err := d.Submit(context.Background(), submission(0), nil)
			if err != nil {
				t.Fatalf("warm-up Submit: %v", err)
			}
			c.groupRecord(warm.GroupID)
			base := counted.Total()

			resp, err := d.Submit(context.Background(), submission(1), nil)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if resp.Hedged != tt.hedged {
				t.Fatalf("hedged = %v, want %v", resp.Hedged, tt.hedged)
			}
			c.groupRecord(resp.GroupID) // the group has ended: nothing more on its path
			if n := counted.Total() - base; n > tt.max || n < tt.min {
				t.Fatalf("%d round trips to Redis on the request path, want %d..%d", n, tt.min, tt.max)
			}
			t.Logf("%d round trips", counted.Total()-base)
		})
	}
}

// metricSum adds up the samples of one metric family that carry label=value
// (every sample when label is empty) across registries.
func metricSum(t *testing.T, regs []*prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	var sum float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				match := label == ""
				for _, lp := range m.GetLabel() {
					match = match || lp.GetName() == label && lp.GetValue() == value
				}
				if match {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// replicas starts n dispatchers on c sharing rs under prefix, as gateways
// run by default: each with its own metrics registry, the same secret, so a
// user action's id is the same on every replica, and a gate in fallback
// mode on c's JetStream.
func replicas(t *testing.T, c *cluster, rs *redistest.Server, prefix string, n int) ([]*Dispatcher, []*prometheus.Registry) {
	t.Helper()
	return gateReplicas(t, c, rs, prefix, n, sharedgate.UnavailableFallback)
}

// run submits requests from workers goroutines per replica until each
// replica has sent perReplica, and returns every error.
func run(ds []*Dispatcher, perReplica, workers int, sub func(replica, i int) Submission) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for r, d := range ds {
		var next atomic.Int64
		for range workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= perReplica {
						return
					}
					_, err := d.Submit(context.Background(), sub(r, i), nil)
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// hedgingPolicy hedges every primary slower than 150 ms under a 5% ceiling.
// Its accept and heartbeat timeouts are long, so that a loaded machine does
// not turn slow accepts into lost attempts and replacements.
const hedgingPolicy = `
policies:
  default:
    control_fraction: 0
    max_attempts: 2
    delay: {initial: 150ms, min: 150ms, max: 150ms, warmup_samples: 1000000}
    deadline: 10s
    min_useful_time: 10ms
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 3s
    duplicate_rate: {ceiling: 0.05, window: 10s, replacement_reserve: 0, reserve: {burst: 0}}
`

// slowThreeInTen makes 3 requests in 10 stall 400 ms before their first
// byte: with a 150 ms hedge delay, 30% of groups would hedge unbudgeted.
func slowThreeInTen() *script {
	fast, slow := behaviour{words: 2}, behaviour{firstByte: 400 * time.Millisecond, words: 2}
	sc := newScript(fast)
	sc.cycle = []behaviour{slow, fast, fast, slow, fast, fast, fast, slow, fast, fast}
	return sc
}

func TestReplicasHoldTheDuplicateRateCeilingTogether(t *testing.T) {
	rs := redistest.Start(t)
	ps := map[string]*provider{}
	sc := slowThreeInTen()
	for _, r := range []string{"a", "b"} {
		ps[r] = newProvider(t, r, sc)
	}
	c := newCluster(t, []string{"a", "b"}, ps, hedgingPolicy)
	ds, regs := replicas(t, c, rs, "ceiling", 2)
	const perReplica = 800
	errs := run(ds, perReplica, 24, func(_, _ int) Submission {
		return Submission{Pool: "general", Request: chat(false)}
	})
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed, first: %v", len(errs), 2*perReplica, errs[0])
	}
	primaries := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RolePrimary))
	extra := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RoleHedge)) +
		metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RoleReplacement))
	refused := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", string(budgets.ReasonDuplicateRate))
	rate := extra / primaries
	t.Logf("primaries %v, extra attempts %v (rate %.4f), refused by the ceiling %v", primaries, extra, rate, refused)
	if primaries != 2*perReplica {
		t.Fatalf("%v primaries, want %d", primaries, 2*perReplica)
	}
	if rate > 0.06 {
		t.Fatalf("cluster-wide duplicate rate %.4f > 0.06 under a 0.05 ceiling", rate)
	}
	// The ceiling, not a lack of slow primaries, kept the rate down.
	if wanted := (refused + extra) / primaries; wanted < 0.2 || rate < 0.03 {
		t.Fatalf("%.3f of groups wanted a hedge, rate %.4f: the workload did not press on the ceiling", wanted, rate)
	}
}

// contestedPolicy lets four groups of one user action run (no hedges),
// so every one of them reaches the election. Its timeouts are long: a group
// whose attempt is declared lost on a loaded machine would have no slot
// left for a replacement and would never reach the election.
const contestedPolicy = `
policies:
  default:
    control_fraction: 0
    hedge: false
    max_attempts: 4
    deadline: 10s
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 3s
`

// contestedCluster is two routes answering one word at once under
// contestedPolicy: groups of one user action race to the gate.
func contestedCluster(t *testing.T) *cluster {
	t.Helper()
	ps := map[string]*provider{}
	sc := newScript(behaviour{words: 1})
	for _, r := range []string{"a", "b"} {
		ps[r] = newProvider(t, r, sc)
	}
	return newCluster(t, []string{"a", "b"}, ps, contestedPolicy)
}

func TestElectionsAcrossReplicasCommitOneGroupPerUserAction(t *testing.T) {
	rs := redistest.Start(t)
	c := contestedCluster(t)
	ds, _ := replicas(t, c, rs, "elect", 2)
	const userActions, perAction = 500, 4 // two groups per user action on each replica

	var mu sync.Mutex
	won := map[string][]string{} // user action → gate values of its committed groups
	var failures []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for ua := range userActions {
		for i := range perAction {
			d := ds[i%2]
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				key := fmt.Sprintf("action-%d", ua)
				resp, err := d.Submit(context.Background(), Submission{Pool: "general", IdempotencyKey: key, Request: chat(false)}, nil)
				mu.Lock()
				defer mu.Unlock()
				var ge *GroupError
				switch {
				case err == nil:
					won[key] = append(won[key], resp.Gate)
				case errors.As(err, &ge) && ge.Code == schemas.ErrAlreadyCommitted:
				default:
					failures = append(failures, err)
				}
			})
		}
	}
	wg.Wait()
	if len(failures) > 0 {
		var ge *GroupError
		errors.As(failures[0], &ge)
		t.Fatalf("%d groups failed otherwise than already_committed, first: %v %+v", len(failures), failures[0], c.attemptRecords(ge.Group, 1))
	}
	// The ledger, the gate's authority, holds each committed winner.
	js, err := jetstream.New(natstest.Connect(t, c.ns))
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := sharedgate.OpenLedger(t.Context(), js, sharedgate.LedgerOptions{Bucket: "elect"})
	if err != nil {
		t.Fatal(err)
	}
	for ua := range userActions {
		key := fmt.Sprintf("action-%d", ua)
		if got := won[key]; len(got) != 1 {
			t.Fatalf("user action %s committed %d groups (%q), want exactly 1", key, len(got), got)
		}
		holder, held, err := ledger.Holder(t.Context(), schemas.UserActionID(ds[0].secret, "", key))
		if err != nil || !held || holder.String() != won[key][0] {
			t.Fatalf("user action %s committed with gate value %q; the ledger holds %v (%v, %v)", key, won[key][0], holder, held, err)
		}
	}
}

func TestRedisLostAndBackMidRun(t *testing.T) {
	rs := redistest.Start(t)
	ps := map[string]*provider{}
	sc := slowThreeInTen()
	for _, r := range []string{"a", "b"} {
		ps[r] = newProvider(t, r, sc)
	}
	c := newCluster(t, []string{"a", "b"}, ps, strings.Replace(hedgingPolicy, "ceiling: 0.05", "ceiling: 0.5", 1))
	ds, regs := replicas(t, c, rs, "outage", 2)

	winners := map[string]int{} // group → winner records
	var recMu sync.Mutex
	done := make(chan struct{})
	var drained sync.WaitGroup
	drained.Go(func() {
		for {
			select {
			case r := <-c.records:
				if r.Outcome == schemas.OutcomeWinner {
					recMu.Lock()
					winners[r.HedgeGroupID]++
					recMu.Unlock()
				}
			case <-done:
				return
			}
		}
	})
	phase := func(name string) (hedges float64) {
		before := metricSum(t, regs, "hedgerow_hedges_launched_total", "", "")
		if errs := run(ds, 150, 8, func(_, _ int) Submission {
			return Submission{Pool: "general", Request: chat(false)}
		}); len(errs) > 0 {
			t.Fatalf("%s: %d primaries lost, first: %v", name, len(errs), errs[0])
		}
		return metricSum(t, regs, "hedgerow_hedges_launched_total", "", "") - before
	}
	if h := phase("redis up"); h == 0 {
		t.Fatal("no hedge launched while Redis is up")
	}
	rs.Kill()
	if h := phase("redis down"); h != 0 {
		t.Fatalf("%v hedges launched with Redis down: hedges must be suppressed", h)
	}
	if n := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", "budget_unavailable"); n == 0 {
		t.Fatal("no hedge suppressed as budget_unavailable while Redis was down")
	}
	rs.Restart()
	if h := phase("redis back"); h == 0 {
		t.Fatal("hedging did not resume once Redis was back")
	}
	close(done)
	drained.Wait()
	recMu.Lock()
	defer recMu.Unlock()
	for g, n := range winners {
		if n > 1 {
			t.Fatalf("group %s committed %d attempts", g, n)
		}
	}
}

// A retry that took over an orphaned request (its gateway died after its
// group committed, no answer kept: the door's in-flight marker proved it,
// docs/architecture.md §2) names that request's group in Supersedes: the
// orphan's winner gate holding is cleared and the retry commits. Any other
// holder stands — another group, even of the same dispatcher — and without
// Supersedes the retry answers already_committed as ever.
func TestRetrySupersedesOnlyTheOrphanedCommitOfTheGroupItNames(t *testing.T) {
	rs := redistest.Start(t)
	c := newCluster(t, []string{"a"}, map[string]*provider{"a": newProvider(t, "a", newScript(behaviour{words: 2}))}, "")
	ds, regs := replicas(t, c, rs, "supersede", 1)
	d := ds[0]
	_, gate := redisShared(t, redisClient(t, rs), "supersede")
	tests := []struct {
		name       string
		supersedes string
		commits    bool
	}{
		{"the orphaned group's commit is superseded", "deaddeadbeef-1", true},
		{"another group's commit of the same dispatcher stands", "deaddeadbeef-2", false},
		{"another dispatcher's commit stands", "0123456789ab-1", false},
		{"without a takeover the commit stands", "", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprintf("orphaned-%d", i)
			orphan, err := gate.Claim(t.Context(), schemas.UserActionID(d.secret, "", key), "deaddeadbeef-1", 1)
			if err != nil || !orphan.Won {
				t.Fatalf("the dead gateway's claim: %+v, %v", orphan, err)
			}
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", IdempotencyKey: key, Request: chat(true),
				Supersedes: tt.supersedes}, nil)
			if !tt.commits {
				var ge *GroupError
				if !errors.As(err, &ge) || ge.Code != schemas.ErrAlreadyCommitted {
					t.Fatalf("Submit = %+v, %v; want already_committed", resp, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Submit: %v; want the retry to commit", err)
			}
			v, perr := arbiter.ParseGateValue(resp.Gate)
			if perr != nil || v.Epoch != orphan.Epoch+1 || !strings.HasPrefix(v.Group, d.ID()+"-") {
				t.Fatalf("the retry's gate value %q; want this dispatcher's group at epoch %d", resp.Gate, orphan.Epoch+1)
			}
		})
	}
	if n := metricSum(t, regs, "hedgerow_gate_superseded_total", "", ""); n != 1 {
		t.Fatalf("hedgerow_gate_superseded_total = %v; want 1", n)
	}
}
