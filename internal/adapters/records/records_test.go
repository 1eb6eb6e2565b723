package records_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig() records.Options {
	return records.Options{Stream: "test_records", MaxAge: time.Hour, MaxBytes: 1 << 20, Replicas: 1,
		Duplicates: time.Minute, MaxPending: 64, CommitTimeout: 5 * time.Second}
}

// openPublisher starts a JetStream server and opens a Publisher of cfg on
// it, its metrics in a registry of their own; js reads the stream.
func openPublisher(t *testing.T, cfg records.Options) (*records.Publisher, jetstream.JetStream, *prometheus.Registry) {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t, natstest.JetStream(t.TempDir())))
	reg := prometheus.NewRegistry()
	p, err := records.Open(context.Background(), nc, cfg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return p, js, reg
}

// lastRecord is the latest record the stream keeps as subject's, read as
// the Reader reads it.
func lastRecord(t *testing.T, js jetstream.JetStream, stream, subject string) []byte {
	t.Helper()
	data, found, err := records.Reader{JS: js, Stream: stream}.Last(context.Background(), subject)
	if err != nil || !found {
		t.Fatalf("last record on %s: %v (found %v)", subject, err, found)
	}
	return data
}

// rec is a record SubjectAndID places: event, group, attempt and a mark.
func rec(event, group string, attempt int, mark string) []byte {
	return []byte(fmt.Sprintf(`{"event":%q,"hedge_group_id":%q,"attempt":%d,"mark":%q}`, event, group, attempt, mark))
}

func TestTheStreamKeepsBatchesAndTheLatestRecordOfEachSubjectIsRead(t *testing.T) {
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	nc := natstest.Connect(t, srv)
	reg := prometheus.NewRegistry()
	p, err := records.Open(context.Background(), nc, testConfig(), reg, nil)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if !p.Keeps() {
		t.Fatal("a server with JetStream: Keeps() = false")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(context.Background(), "test_records")
	if err != nil {
		t.Fatalf("the stream was not created: %v", err)
	}
	got := info.CachedInfo().Config
	if got.MaxAge != time.Hour || got.MaxBytes != 1<<20 || got.MaxMsgsPerSubject != 1 || got.Duplicates != time.Minute ||
		len(got.Subjects) != 1 || got.Subjects[0] != records.SubjectPrefix+">" {
		t.Fatalf("stream config = %+v", got)
	}

	group := schemas.StoredGroupSubject("abc-1")
	// The commit's record, the attempt's, then the group's final record,
	// which replaces the commit's for a reader.
	if err := p.Commit(group, rec(schemas.EventGroupCommitted, "abc-1", 0, "commit")); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if m := lastRecord(t, js, "test_records", group); !strings.Contains(string(m), `"commit"`) {
		t.Fatalf("the committed record after Commit returned: %s", m)
	}
	attempt := schemas.StoredAttemptSubject("abc-1", 1)
	p.Publish(attempt, rec(schemas.EventAttemptComplete, "abc-1", 1, "attempt"))
	p.Publish(group, rec(schemas.EventGroupComplete, "abc-1", 0, "final"))
	flush(t, p)
	if m := lastRecord(t, js, "test_records", group); !strings.Contains(string(m), `"final"`) {
		t.Fatalf("the final record did not replace the commit's: %s", m)
	}
	if m := lastRecord(t, js, "test_records", attempt); !strings.Contains(string(m), `"attempt"`) {
		t.Fatalf("the attempt record: %s", m)
	}
	kept, err := p.Reader().Kept(context.Background(), time.Time{})
	if err != nil || len(kept) != 2 {
		t.Fatalf("kept %d records (%v), want 2 (one group, one attempt): %q", len(kept), err, kept)
	}
	if n := failures(t, reg); n != 0 {
		t.Fatalf("%v publication failures counted", n)
	}

	// Reopening (another gateway starting) updates the stream in place.
	cfg := testConfig()
	cfg.MaxAge = 2 * time.Hour
	if _, err := records.Open(context.Background(), nc, cfg, nil, nil); err != nil {
		t.Fatalf("reopen with a new max_age: %v", err)
	}
	if m := lastRecord(t, js, "test_records", group); !strings.Contains(string(m), `"final"`) {
		t.Fatalf("reopening lost the record: %s", m)
	}
}

func TestWithoutJetStreamRecordsAreNotKeptAndNothingFails(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	p, err := records.Open(context.Background(), nc, testConfig(), nil, nil)
	if err != nil {
		t.Fatalf("a server without JetStream must not fail the gateway: %v", err)
	}
	if p.Keeps() {
		t.Fatal("Keeps() = true without JetStream")
	}
	if err := p.Commit(schemas.StoredGroupSubject("g-1"), []byte(`{}`)); err != nil {
		t.Fatalf("commit without JetStream: %v", err)
	}
	p.Publish(schemas.StoredGroupSubject("g-1"), []byte(`{}`))
	flush(t, p)
}

func flush(t *testing.T, p *records.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// failures sums hedgerow_records_publish_failures_total in reg.
func failures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "hedgerow_records_publish_failures_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func TestAfterAFailedCommitTheNextAreQueuedWithoutWaiting(t *testing.T) {
	p, js, reg := openPublisher(t, testConfig())
	// The stream goes away: a publication to its subjects has no answer.
	if err := js.DeleteStream(context.Background(), "test_records"); err != nil {
		t.Fatal(err)
	}
	first := p.Commit(schemas.StoredGroupSubject("g-1"), []byte(`{}`))
	if first == nil || errors.Is(first, records.ErrNotAwaited) {
		t.Fatalf("a commit to a missing stream: %v, want its failure", first)
	}
	if err := p.Commit(schemas.StoredGroupSubject("g-2"), []byte(`{}`)); !errors.Is(err, records.ErrNotAwaited) {
		t.Fatalf("the commit after a failure: %v, want ErrNotAwaited", err)
	}
	if n := failures(t, reg); n < 1 {
		t.Fatalf("%v failures counted, want the failed commit's", n)
	}
}
