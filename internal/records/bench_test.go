package records_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/records"
	"github.com/hedgerow/hedgerow/schemas"
)

// BenchmarkCommitPathWait measures what keeping a committed group's record
// adds before its answer leaves (Publisher.Commit: a JetStream publish to a
// file store and its ack, on loopback), beside a core NATS round trip
// (publish and flush) on the same server, open loop at 1,000 records a
// second. It reports both p50 and p99 and their ratio.
//
//	go test ./internal/records/ -run '^$' -bench CommitPathWait -benchtime 3000x
func BenchmarkCommitPathWait(b *testing.B) {
	srv := natstest.Start(b, natstest.JetStream(b.TempDir()))
	nc := natstest.Connect(b, srv)
	p, err := records.Open(context.Background(), nc, records.Config{Stream: "bench_records", MaxAge: time.Hour,
		MaxBytes: 1 << 30, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	rtt := natstest.Connect(b, srv)
	// A group record's size, as the dispatcher marshals one.
	data, err := schemas.GroupRecord{HedgeGroupID: "0123456789ab-1", UserActionID: "ua_0123456789abcdef0123456789abcdef",
		RouteClass: "general", OperationClass: "default", ModelClass: "general", Outcome: schemas.GroupCommitted,
		WinnerAttempt: 1, WinnerRole: schemas.RolePrimary, WinnerRoute: "a", PromptFingerprint: "0123456789abcdef"}.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	run := func(name string, op func(i int) error) (p50, p99 time.Duration) {
		const rate = 1000
		latencies := make([]time.Duration, b.N)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range b.N {
			if wait := time.Until(start.Add(time.Duration(i) * time.Second / rate)); wait > 0 {
				time.Sleep(wait) // the open-loop schedule
			}
			wg.Go(func() {
				began := time.Now()
				if err := op(i); err != nil {
					b.Errorf("%s: %v", name, err)
				}
				latencies[i] = time.Since(began)
			})
		}
		wg.Wait()
		slices.Sort(latencies)
		return latencies[len(latencies)/2], latencies[len(latencies)*99/100]
	}
	b.ResetTimer()
	core50, core99 := run("core", func(i int) error {
		if err := rtt.Publish("bench.core", data); err != nil {
			return err
		}
		return rtt.FlushTimeout(5 * time.Second)
	})
	commit50, commit99 := run("commit", func(i int) error {
		g := fmt.Sprintf("bench-%d-%d", b.N, i)
		return p.Commit(schemas.StoredGroupSubject(g), schemas.StoredGroupID(g, schemas.EventGroupCommitted), data)
	})
	b.StopTimer()
	b.ReportMetric(float64(commit50.Microseconds()), "commit-p50-µs")
	b.ReportMetric(float64(commit99.Microseconds()), "commit-p99-µs")
	b.ReportMetric(float64(core50.Microseconds()), "core-rtt-p50-µs")
	b.ReportMetric(float64(core99.Microseconds()), "core-rtt-p99-µs")
	b.ReportMetric(float64(commit50)/float64(core50), "p50-ratio")
	b.ReportMetric(float64(commit99)/float64(core99), "p99-ratio")
}
