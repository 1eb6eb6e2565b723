package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// BenchmarkAdmissionAndElectionOnRedis measures what Redis adds to a group's
// request path — its admission (one store batch) and its election (one gate
// script) — on loopback, open loop at 1,000 groups a second: each group
// starts on schedule whether or not earlier ones have finished, so queueing
// shows in the tail. It reports the p50 and p99 of admission + election.
//
//	go test ./dispatcher/ -run '^$' -bench AdmissionAndElection -benchtime 3000x
func BenchmarkAdmissionAndElectionOnRedis(b *testing.B) {
	rs := redistest.Start(b)
	client := redisClient(b, rs)
	store, gate := redisShared(b, client, "bench")
	admit := budgets.AdmitRequest{
		Pool: "general", Window: "default/general",
		Attempts:   budgets.AttemptPolicy{Max: 2, TTL: time.Minute},
		Spend:      budgets.SpendPolicy{InputUnits: 100, OutputUnits: 256, ReservationTTL: time.Minute},
		Duplicates: budgets.DuplicateCeiling{Ceiling: 0.08, Window: 10 * time.Second, Slots: 10},
	}
	// Warm up: the pool's connections are dialled and the scripts loaded
	// before the clock starts.
	for i := range 200 {
		req := admit
		req.UserAction = fmt.Sprintf("warm-%d-%d", b.N, i)
		adm, err := store.Admit(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := gate.Claim(context.Background(), req.UserAction, "g", 1); err != nil {
			b.Fatal(err)
		}
		_ = store.Settle(context.Background(), adm.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 20})
	}
	const rate = 1000 // groups per second
	interval := time.Second / rate
	latencies := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait) // the open-loop schedule
		}
		wg.Go(func() {
			began := time.Now()
			req := admit
			req.UserAction = fmt.Sprintf("bench-%d-%d", b.N, i)
			adm, err := store.Admit(ctx, req)
			if err != nil || !adm.Allowed {
				b.Errorf("admit: %+v, %v", adm, err)
				return
			}
			if c, err := gate.Claim(ctx, req.UserAction, "g", 1); err != nil || !c.Won {
				b.Errorf("claim: %+v, %v", c, err)
				return
			}
			latencies[i] = time.Since(began)
			_ = store.Settle(ctx, adm.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 20})
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(latencies)
	q := func(p float64) float64 { return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(0, "ns/op")
}
