package redisstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// BenchmarkAdmitReserveSettle runs a hedged user action's budget calls on
// loopback — Admit, ReserveExtra, then Settle of both — against a real
// redis-server and a real three-master cluster, with the default timeout,
// and reports the latency percentiles of Admit and ReserveExtra.
func BenchmarkAdmitReserveSettle(b *testing.B) {
	deployments := []struct {
		name   string
		client func(b *testing.B) redis.UniversalClient
	}{
		{"standalone", func(b *testing.B) redis.UniversalClient { return standaloneClient(b, redistest.Start(b)) }},
		{"cluster", func(b *testing.B) redis.UniversalClient { return clusterClient(b, redistest.StartCluster(b)) }},
	}
	for _, dep := range deployments {
		b.Run(dep.name, func(b *testing.B) {
			store, err := redisstore.New(dep.client(b), redisstore.Options{Prefix: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			if err := store.LoadScripts(ctx); err != nil {
				b.Fatal(err)
			}
			var admits, extras []time.Duration
			i := 0
			for b.Loop() {
				i++
				p := ceilinged(fmt.Sprintf("ua-bench-%d", i))
				p.Spend.TenantCeiling = 1 << 50 // never reached, however long the run
				start := time.Now()
				a, err := store.Admit(ctx, p)
				admitted := time.Now()
				if err != nil || !a.Allowed {
					b.Fatalf("Admit %d: %+v, %v", i, a, err)
				}
				g, err := store.ReserveExtra(ctx, hedgeOf(p, "route-bench"))
				granted := time.Now()
				if err != nil || !g.Allowed {
					b.Fatalf("ReserveExtra %d: %+v, %v", i, g, err)
				}
				admits = append(admits, admitted.Sub(start))
				extras = append(extras, granted.Sub(admitted))
				for _, id := range []budgets.ReservationID{a.Reservation, g.Reservation} {
					if err := store.Settle(ctx, id, schemas.Usage{InputUnits: 10, OutputUnits: 50}); err != nil {
						b.Fatalf("Settle %d: %v", i, err)
					}
				}
			}
			reportPercentiles(b, "admit", admits)
			reportPercentiles(b, "extra", extras)
		})
	}
}

// reportPercentiles reports the p50 and p99 of samples in microseconds.
func reportPercentiles(b *testing.B, name string, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	at := func(q float64) float64 {
		return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), name+"-p50-µs")
	b.ReportMetric(at(0.99), name+"-p99-µs")
}
