package records_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/adapters/records/recordstest"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/report/reporttest"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestRecordsPublishedToTheStreamReadBackIntoTheSameReport(t *testing.T) {
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	nc := natstest.Connect(t, srv)
	cfg := testConfig()
	cfg.MaxPending, cfg.MaxBytes = 4096, 64<<20
	p, err := records.Open(context.Background(), nc, cfg, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 1,500 groups, one a second, ending now.
	start := time.Now().Add(-1500 * time.Second)
	lines, err := reporttest.Records(11, 1500, start)
	if err != nil {
		t.Fatal(err)
	}
	published := recordstest.Keep(t, p, lines)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := p.Reader().Records(ctx, time.Time{})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if got.Len() != published {
		t.Fatalf("read %d records, published %d", got.Len(), published)
	}
	want, err := report.ReadJSONL(bytes.NewReader(bytes.Join(lines, []byte("\n"))), "lines")
	if err != nil {
		t.Fatal(err)
	}
	a, b := jsonOf(t, report.Compute(got, report.Options{})), jsonOf(t, report.Compute(want, report.Options{}))
	if a != b {
		t.Fatalf("report from the stream:\n%s\nfrom the records published:\n%s", a, b)
	}

	t0 := time.Now()
	recent, err := p.Reader().Records(ctx, start.Add(900*time.Second))
	t.Logf("read in %v", time.Since(t0))
	if err != nil {
		t.Fatal(err)
	}
	if n := report.Compute(recent, report.Options{}).Total.Groups; n != 600 {
		t.Errorf("since the 900th group: %d groups, want 600 (one a second)", n)
	}
}

// A superseded record is kept on a subject of its own: the orphan's
// committed record stays beside it (its usage was paid), and the report
// read back from the stream counts the takeover's commit only, the orphan's
// apart (docs/architecture.md §9).
func TestASupersededRecordIsKeptBesideTheOrphansRecordAndReadBackApart(t *testing.T) {
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	nc := natstest.Connect(t, srv)
	p, err := records.Open(context.Background(), nc, testConfig(), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := reporttest.TakeoverRecords(time.Now().Add(-time.Minute), reporttest.Takeover{Marked: true, Named: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := recordstest.Keep(t, p, lines); n != 5 {
		t.Fatalf("kept %d records, want 5: two groups, their winners, the superseded record", n)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var orphan schemas.GroupRecord
	if err := json.Unmarshal(lastRecord(t, js, testConfig().Stream, schemas.StoredGroupSubject(reporttest.Orphan)), &orphan); err != nil ||
		orphan.Event != schemas.EventGroupCommitted {
		t.Fatalf("the orphan's record %+v (%v); want its committed record, kept", orphan, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := p.Reader().Records(ctx, time.Time{})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	rep := report.Compute(got, report.Options{})
	if rep.Records != 5 || rep.Total.CommittedGroups != 1 || rep.Total.SupersededGroups != 1 || rep.CommittedTwice != 0 ||
		rep.Total.Usage.Superseded != 110 {
		t.Fatalf("report from the stream: %s\nwant 5 records, 1 committed, 1 superseded (110 units), none committed twice", jsonOf(t, rep))
	}
}

func TestReadingWithoutJetStreamSaysRecordsAreNotKept(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range []records.Reader{{}, {JS: js, Stream: "absent"}} {
		if _, err := r.Records(ctx, time.Time{}); !errors.Is(err, report.ErrNotKept) {
			t.Errorf("reader %+v: %v, want report.ErrNotKept", r.Stream, err)
		}
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
