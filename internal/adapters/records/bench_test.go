package records_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/arbiter/sharedgate"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// BenchmarkCommitPathWait measures what keeping a committed group's record
// adds before its answer leaves (Publisher.Commit: a JetStream publish to a
// file store and its ack, on loopback), beside a core NATS round trip
// (publish and flush) on the same server, open loop at 1,000 records a
// second. It reports both p50 and p99 and their ratio.
//
//	go test ./internal/adapters/records/ -run '^$' -bench CommitPathWait -benchtime 3000x
func BenchmarkCommitPathWait(b *testing.B) {
	srv := natstest.Start(b, natstest.JetStream(b.TempDir()))
	nc := natstest.Connect(b, srv)
	p, err := records.Open(context.Background(), nc, records.Options{Stream: "bench_records", MaxAge: time.Hour,
		MaxBytes: 1 << 30, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	rtt := natstest.Connect(b, srv)
	data := groupRecordBytes(b)
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
		return p.Commit(schemas.StoredGroupSubject(g), data)
	})
	b.StopTimer()
	b.ReportMetric(float64(commit50.Microseconds()), "commit-p50-µs")
	b.ReportMetric(float64(commit99.Microseconds()), "commit-p99-µs")
	b.ReportMetric(float64(core50.Microseconds()), "core-rtt-p50-µs")
	b.ReportMetric(float64(core99.Microseconds()), "core-rtt-p99-µs")
	b.ReportMetric(float64(commit50)/float64(core50), "p50-ratio")
	b.ReportMetric(float64(commit99)/float64(core99), "p99-ratio")
}

// BenchmarkDurability measures what fsyncing every JetStream write costs on
// the request path (docs/architecture.md §6, "Durability"): the gate
// ledger's claim (sharedgate.KVLedger.Propose, a key-value create) and the
// commit record's wait (Publisher.Commit), on a file store in the test's
// temporary directory, closed loop, with nats-server's default sync timer
// and with `sync_interval: always` side by side in one run.
//
//	go test ./internal/adapters/records/ -run '^$' -bench Durability -benchtime 2000x
func BenchmarkDurability(b *testing.B) {
	for _, sync := range []struct {
		name string
		opts []natstest.Option
	}{
		{"default", nil},
		{"always", []natstest.Option{natstest.SyncAlways()}},
	} {
		b.Run(sync.name, func(b *testing.B) {
			srv := natstest.Start(b, append([]natstest.Option{natstest.JetStream(b.TempDir())}, sync.opts...)...)
			nc := natstest.Connect(b, srv)
			ctx := context.Background()
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			ledger, err := sharedgate.OpenLedger(ctx, js, sharedgate.LedgerOptions{Bucket: "bench_gate", TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			p, err := records.Open(ctx, nc, records.Options{Stream: "bench_records", MaxAge: time.Hour,
				MaxBytes: 1 << 30, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			data := groupRecordBytes(b)
			claims := make([]time.Duration, b.N)
			commits := make([]time.Duration, b.N)
			b.ResetTimer()
			for i := range b.N {
				g := fmt.Sprintf("bench-%d-%d", b.N, i)
				began := time.Now()
				if _, won, err := ledger.Propose(ctx, "ua-"+g, arbiter.GateValue{Group: g, Attempt: 1, Epoch: 1}); err != nil || !won {
					b.Fatalf("claim %d: won %v, %v", i, won, err)
				}
				claims[i] = time.Since(began)
				began = time.Now()
				if err := p.Commit(schemas.StoredGroupSubject(g), data); err != nil {
					b.Fatalf("commit record %d: %v", i, err)
				}
				commits[i] = time.Since(began)
			}
			b.StopTimer()
			for _, m := range []struct {
				name string
				lat  []time.Duration
			}{{"claim", claims}, {"commit", commits}} {
				slices.Sort(m.lat)
				b.ReportMetric(float64(m.lat[len(m.lat)/2].Microseconds()), m.name+"-p50-µs")
				b.ReportMetric(float64(m.lat[len(m.lat)*99/100].Microseconds()), m.name+"-p99-µs")
			}
		})
	}
}

// groupRecordBytes is a committed group's record of the usual size, as the
// dispatcher marshals one.
func groupRecordBytes(b *testing.B) []byte {
	b.Helper()
	data, err := schemas.GroupRecord{HedgeGroupID: "0123456789ab-1", UserActionID: "ua_0123456789abcdef0123456789abcdef",
		RouteClass: "general", OperationClass: "default", ModelClass: "general", Outcome: schemas.GroupCommitted,
		WinnerAttempt: 1, WinnerRole: schemas.RolePrimary, WinnerRoute: "a", PromptFingerprint: "0123456789abcdef"}.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkConcurrentGroups keeps the records of groups as concurrent
// dispatchers do — per group an awaited commit record, then its attempt's
// and its final record without waiting — from 32 goroutines, with
// `sync_interval: always`: the commits' waits and how many records each
// batch message carried (group commit, docs/architecture.md §9).
//
//	go test ./internal/adapters/records/ -run '^$' -bench ConcurrentGroups -benchtime 4000x
func BenchmarkConcurrentGroups(b *testing.B) {
	const workers = 32
	srv := natstest.Start(b, natstest.JetStream(b.TempDir()), natstest.SyncAlways())
	nc := natstest.Connect(b, srv)
	reg := prometheus.NewRegistry()
	p, err := records.Open(context.Background(), nc, records.Options{Stream: "bench_records", MaxAge: time.Hour,
		MaxBytes: 1 << 30, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second}, reg, nil)
	if err != nil {
		b.Fatal(err)
	}
	data := groupRecordBytes(b)
	commits := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < b.N; i += workers {
				g := fmt.Sprintf("bench-%d-%d", b.N, i)
				began := time.Now()
				if err := p.Commit(schemas.StoredGroupSubject(g), data); err != nil {
					b.Errorf("commit record %d: %v", i, err)
					return
				}
				commits[i] = time.Since(began)
				p.Publish(schemas.StoredAttemptSubject(g, 1), data)
				p.Publish(schemas.StoredGroupSubject(g), data)
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	slices.Sort(commits)
	b.ReportMetric(float64(commits[len(commits)/2].Microseconds()), "commit-p50-µs")
	b.ReportMetric(float64(commits[len(commits)*99/100].Microseconds()), "commit-p99-µs")
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "hedgerow_records_batch_records" {
			h := mf.GetMetric()[0].GetHistogram()
			b.ReportMetric(h.GetSampleSum()/float64(max(h.GetSampleCount(), 1)), "records/batch")
		}
	}
}
