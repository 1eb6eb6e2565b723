package dispatcher

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter/sharedgate"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// outagePerPhase is how many new contested user actions each phase of the
// outage test sends in fallback mode; `-outage.per-phase 340` runs the
// 1,000-action figure of docs/architecture.md §6.
var outagePerPhase = flag.Int("outage.per-phase", 100, "new contested user actions per phase of the gate outage test (fallback mode)")

// gateReplicas starts n dispatchers on c sharing rs under prefix (see
// replicas), whose gates handle an unreachable Redis as mode says; in
// fallback mode each has its own connection to the bucket (named prefix)
// on c's JetStream, as gateways do.
func gateReplicas(t *testing.T, c *cluster, rs *redistest.Server, prefix string, n int, mode sharedgate.Unavailable) ([]*Dispatcher, []*prometheus.Registry) {
	t.Helper()
	var ds []*Dispatcher
	var regs []*prometheus.Registry
	for range n {
		client := redisClient(t, rs)
		store, err := redisstore.New(client, redisstore.Options{Prefix: prefix, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cfg := sharedgate.RedisGateOptions{Prefix: prefix, Timeout: time.Second, OnUnavailable: mode}
		if mode == sharedgate.UnavailableFallback {
			js, err := jetstream.New(natstest.Connect(t, c.ns))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Ledger, err = sharedgate.OpenLedger(t.Context(), js, sharedgate.LedgerOptions{Bucket: prefix, Timeout: 5 * time.Second}); err != nil {
				t.Fatal(err)
			}
		}
		gate, err := sharedgate.NewRedisGate(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		ds = append(ds, c.addDispatcher(Options{Store: store, Gate: gate, Registerer: reg, Secret: []byte("shared-secret")}))
		regs = append(regs, reg)
	}
	return ds, regs
}

// commitLog counts the commits of each user action (by Idempotency-Key)
// and every failure other than already_committed.
type commitLog struct {
	mu       sync.Mutex
	commits  map[string]int
	failures []error
}

// submit sends one request of key to d and records what came of it.
func (l *commitLog) submit(d *Dispatcher, key string) {
	_, err := d.Submit(context.Background(), Submission{Pool: "general", IdempotencyKey: key, Request: chat(false)}, nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	var ge *GroupError
	switch {
	case err == nil:
		l.commits[key]++
	case errors.As(err, &ge) && ge.Code == schemas.ErrAlreadyCommitted:
	default:
		l.failures = append(l.failures, fmt.Errorf("%s: %w", key, err))
	}
}

// TestNoUserActionCommitsTwiceThroughARedisOutageAndAnEmptyRestart sends
// every user action to two replicas at once — two groups on each — with
// Redis up, then stopped, then restarted empty; each phase also retries
// every user action of the phases before on both replicas. In fallback
// mode no user action commits twice and every user action commits; in
// local mode, the scenario's teeth, the outage and the empty restart
// commit user actions twice.
func TestNoUserActionCommitsTwiceThroughARedisOutageAndAnEmptyRestart(t *testing.T) {
	tests := []struct {
		mode        sharedgate.Unavailable
		perPhase    int // new contested user actions per phase
		wantDoubles bool
	}{
		{sharedgate.UnavailableFallback, *outagePerPhase, false},
		{sharedgate.UnavailableLocal, 40, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			rs := redistest.Start(t)
			c := contestedCluster(t)
			ds, _ := gateReplicas(t, c, rs, "outage"+string(tt.mode), 2, tt.mode)
			log := &commitLog{commits: map[string]int{}}
			var keys []string
			phase := func(name string) {
				var wg sync.WaitGroup
				sem := make(chan struct{}, 32)
				send := func(d *Dispatcher, key string) {
					wg.Go(func() {
						sem <- struct{}{}
						defer func() { <-sem }()
						log.submit(d, key)
					})
				}
				for _, key := range keys { // retries of committed user actions
					send(ds[0], key)
					send(ds[1], key)
				}
				for i := range tt.perPhase {
					key := fmt.Sprintf("%s-%d", name, i)
					keys = append(keys, key)
					for g := range 4 {
						send(ds[g%2], key)
					}
				}
				wg.Wait()
			}
			phase("up")
			rs.Kill()
			phase("down")
			rs.Restart()
			phase("restarted")

			doubles := 0
			for _, key := range keys {
				n := log.commits[key]
				if n > 1 {
					doubles++
				}
				if n == 0 && !tt.wantDoubles {
					t.Errorf("user action %s never committed", key)
				}
			}
			t.Logf("mode %s: %d contested user actions, %d committed twice or more, %d other failures",
				tt.mode, len(keys), doubles, len(log.failures))
			if tt.wantDoubles {
				if doubles == 0 {
					t.Fatal("local mode committed no user action twice: the outage did not reach the gate")
				}
				return
			}
			if doubles > 0 {
				t.Fatalf("%d of %d user actions committed twice", doubles, len(keys))
			}
			if len(log.failures) > 0 {
				t.Fatalf("%d submissions failed otherwise than already_committed, first: %v", len(log.failures), log.failures[0])
			}
		})
	}
}
