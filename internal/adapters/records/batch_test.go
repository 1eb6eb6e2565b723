package records_test

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/report/reporttest"
	"github.com/hedgerow/hedgerow/schemas"
)

// messages is every message the stream holds, in stream order: subject and
// body.
func messages(t *testing.T, js jetstream.JetStream, stream string) [][2]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, [2]string{m.Subject, string(m.Data)})
	}
	return out
}

func TestRecordsQueuedWhileABatchIsInFlightGoOutTogetherAndACommitWaitsForItsOwn(t *testing.T) {
	p, js, reg := openPublisher(t, testConfig())
	// Batches 2 and 3 are held until the test lets them go; the hook runs
	// on the sender, after the batch before was acknowledged and its
	// commits answered.
	entered := make(chan uint64)
	release := map[uint64]chan struct{}{2: make(chan struct{}), 3: make(chan struct{})}
	records.SetBeforeBatch(p, func(seq uint64, _ int) {
		if c, ok := release[seq]; ok {
			entered <- seq
			<-c
		}
	})

	// An idle publisher sends a commit at once, alone: batch 1.
	if err := p.Commit(schemas.StoredGroupSubject("g-0"), rec(schemas.EventGroupCommitted, "g-0", 0, "idle")); err != nil {
		t.Fatalf("idle commit: %v", err)
	}
	if got := messages(t, js, "test_records"); len(got) != 1 || !strings.Contains(got[0][1], `"idle"`) ||
		strings.Count(got[0][1], "\n") != 1 || !strings.HasPrefix(got[0][0], records.SubjectPrefix+records.BatchToken+".") {
		t.Fatalf("after an idle commit the stream holds %q, want its one batch", got)
	}

	// Batch 2, g-1's commit, is held in flight; meanwhile g-2's commit and
	// two records are queued.
	c1, c2 := make(chan error, 1), make(chan error, 1)
	go func() {
		c1 <- p.Commit(schemas.StoredGroupSubject("g-1"), rec(schemas.EventGroupCommitted, "g-1", 0, "one"))
	}()
	if seq := <-entered; seq != 2 {
		t.Fatalf("batch %d held, want 2", seq)
	}
	go func() {
		c2 <- p.Commit(schemas.StoredGroupSubject("g-2"), rec(schemas.EventGroupCommitted, "g-2", 0, "two"))
	}()
	p.Publish(schemas.StoredAttemptSubject("g-1", 1), rec(schemas.EventAttemptComplete, "g-1", 1, "attempt"))
	p.Publish(schemas.StoredGroupSubject("g-1"), rec(schemas.EventGroupComplete, "g-1", 0, "final"))
	waitQueued(t, p)
	close(release[2])
	if err := <-c1; err != nil {
		t.Fatalf("g-1's commit: %v", err)
	}
	// Batch 3 is entered only after batch 2's commits were answered: g-2's
	// is in batch 3 and must not have returned.
	if seq := <-entered; seq != 3 {
		t.Fatalf("batch %d held, want 3", seq)
	}
	select {
	case err := <-c2:
		t.Fatalf("g-2's commit returned (%v) before the batch holding its record was sent", err)
	default:
	}
	close(release[3])
	if err := <-c2; err != nil {
		t.Fatalf("g-2's commit: %v", err)
	}
	flush(t, p)
	got := messages(t, js, "test_records")
	if len(got) != 3 {
		t.Fatalf("the stream holds %d messages, want 3 batches: %q", len(got), got)
	}
	third := strings.Split(strings.TrimSuffix(got[2][1], "\n"), "\n")
	if j := strings.Join(third, "\n"); len(third) != 3 || !strings.Contains(j, `"two"`) || !strings.Contains(j, `"attempt"`) || !strings.Contains(j, `"final"`) ||
		strings.Index(j, `"attempt"`) > strings.Index(j, `"final"`) {
		t.Fatalf("the batch after the one in flight: %q, want g-2's commit, the attempt and g-1's final record (in their order)", third)
	}
	if got[0][0] == got[1][0] || got[1][0] == got[2][0] {
		t.Fatalf("batches share a subject: %q", got)
	}
	if m := lastRecord(t, js, "test_records", schemas.StoredGroupSubject("g-1")); !strings.Contains(string(m), `"final"`) {
		t.Fatalf("g-1's record: %s, want its final one", m)
	}
	if n := failures(t, reg); n != 0 {
		t.Fatalf("%v failures counted", n)
	}
}

func TestRecordsNobodyWaitsForRideWithTheNextCommitOrGoOutAfterTheLinger(t *testing.T) {
	for _, tc := range []struct {
		name string
		// then is what follows two Publishes, with the linger set to
		// linger; want is the stream's messages after it, as the records'
		// marks of each batch.
		linger time.Duration
		then   func(t *testing.T, p *records.Publisher)
		want   [][]string
	}{
		{"a commit's batch carries the records queued before it", time.Hour, func(t *testing.T, p *records.Publisher) {
			if err := p.Commit(schemas.StoredGroupSubject("g-2"), rec(schemas.EventGroupCommitted, "g-2", 0, "commit")); err != nil {
				t.Fatal(err)
			}
		}, [][]string{{"attempt", "final", "commit"}}},
		{"a flush sends what lingers at once", time.Hour, func(t *testing.T, p *records.Publisher) {
			flush(t, p)
		}, [][]string{{"attempt", "final"}}},
		{"with no commit they go out together after the linger", 50 * time.Millisecond, func(t *testing.T, p *records.Publisher) {}, [][]string{{"attempt", "final"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Linger = tc.linger
			p, js, reg := openPublisher(t, cfg)
			p.Publish(schemas.StoredAttemptSubject("g-1", 1), rec(schemas.EventAttemptComplete, "g-1", 1, "attempt"))
			p.Publish(schemas.StoredGroupSubject("g-1"), rec(schemas.EventGroupComplete, "g-1", 0, "final"))
			if tc.linger == time.Hour {
				if got := messages(t, js, "test_records"); len(got) != 0 {
					t.Fatalf("records nobody waits for went out alone: %q", got)
				}
			}
			tc.then(t, p)
			var got [][]string
			eventually.True(t, 10*time.Second, "the stream holding every record", func() bool {
				got = got[:0]
				n := 0
				for _, m := range messages(t, js, "test_records") {
					var marks []string
					for _, line := range strings.Split(strings.TrimSuffix(m[1], "\n"), "\n") {
						var r struct{ Mark string }
						if err := json.Unmarshal([]byte(line), &r); err != nil {
							t.Fatalf("batch line %q: %v", line, err)
						}
						marks = append(marks, r.Mark)
					}
					n += len(marks)
					got = append(got, marks)
				}
				return n == len(slices.Concat(tc.want...))
			})
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("the stream's batches hold %q, want %q", got, tc.want)
			}
			if n := failures(t, reg); n != 0 {
				t.Fatalf("%v failures counted", n)
			}
		})
	}
}

// waitQueued waits until the publisher holds four records beyond what it
// acknowledged: batch 2's in flight and three queued (g-2's commit is
// queued by its goroutine). It polls the publisher's own count, yielding;
// nothing is slept on.
func waitQueued(t *testing.T, p *records.Publisher) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for records.Unsettled(p) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d records unsettled, want 4", records.Unsettled(p))
		}
		runtime.Gosched()
	}
}

func TestBatchedAndPerRecordStreamsReadTheSameRecords(t *testing.T) {
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := reporttest.Records(5, 200, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Each group is first kept at its commit, as a dispatcher does.
	var all [][]byte
	for _, l := range lines {
		if bytes.Contains(l, []byte(`"event":"`+schemas.EventGroupComplete+`"`)) {
			all = append(all, bytes.Replace(l, []byte(schemas.EventGroupComplete), []byte(schemas.EventGroupCommitted), 1))
		}
		all = append(all, l)
	}
	// Each stream in a region of its own, so their subjects do not overlap.
	read := func(stream string) []records.Kept {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		kept, err := records.Reader{JS: js, Stream: stream, Region: strings.TrimSuffix(stream, "_records")}.Kept(ctx, time.Time{})
		if err != nil {
			t.Fatalf("read %s: %v", stream, err)
		}
		return kept
	}

	// A stream an older gateway wrote: one message per record, on its subject.
	old := testConfig()
	old.Stream, old.Region, old.MaxBytes = "old_records", "old", 64<<20
	if _, err := js.CreateStream(context.Background(), old.StreamConfig()); err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		subject, id, keep, err := records.SubjectAndID(l)
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			if _, err := js.Publish(context.Background(), schemas.RegionWire("old").StoredSubject(subject), l, jetstream.WithMsgID(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The same records in batches.
	batched := testConfig()
	batched.Stream, batched.Region, batched.MaxBytes, batched.MaxPending = "batched_records", "batched", 64<<20, 4096
	p, err := records.Open(context.Background(), nc, batched, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		subject, _, keep, _ := records.SubjectAndID(l)
		if keep {
			p.Publish(subject, l)
		}
	}
	flush(t, p)
	// And a batch written by hand: lines split with CRLF and empty lines.
	byHand := testConfig()
	byHand.Stream, byHand.Region, byHand.MaxBytes = "hand_records", "hand", 64<<20
	if _, err := js.CreateStream(context.Background(), byHand.StreamConfig()); err != nil {
		t.Fatal(err)
	}
	var body []byte
	for i, l := range all {
		if _, _, keep, _ := records.SubjectAndID(l); !keep {
			continue
		}
		body = append(body, l...)
		body = append(body, "\r\n"...)
		if i%7 == 0 {
			body = append(body, '\n')
		}
		if len(body) > 32<<10 || i == len(all)-1 {
			subject := records.BatchSubject("hand", "byhand", uint64(i))
			if _, err := js.Publish(context.Background(), subject, body); err != nil {
				t.Fatal(err)
			}
			body = nil
		}
	}

	want := read("old_records")
	if len(want) == 0 {
		t.Fatal("nothing read from the per-record stream")
	}
	for _, k := range want {
		if bytes.Contains(k.Data, []byte(schemas.EventGroupCommitted)) {
			t.Fatalf("a committed record replaced by its final one was read: %s", k.Data)
		}
	}
	sortKept := func(k []records.Kept) []records.Kept {
		k = slices.Clone(k)
		slices.SortFunc(k, func(a, b records.Kept) int { return strings.Compare(a.Subject, b.Subject) })
		return k
	}
	for _, stream := range []string{"batched_records", "hand_records"} {
		got := read(stream)
		if !slices.EqualFunc(sortKept(got), sortKept(want), func(a, b records.Kept) bool {
			return a.Subject == b.Subject && bytes.Equal(a.Data, b.Data)
		}) {
			g, w := sortKept(got), sortKept(want)
			for i := range min(len(g), len(w)) {
				if g[i].Subject != w[i].Subject || !bytes.Equal(g[i].Data, w[i].Data) {
					t.Logf("first difference: %s %s\n%s %s", g[i].Subject, g[i].Data, w[i].Subject, w[i].Data)
					break
				}
			}
			t.Fatalf("%s read %d records, the per-record stream %d, or they differ", stream, len(got), len(want))
		}
	}
	if got := read("batched_records"); !slices.EqualFunc(got, want, func(a, b records.Kept) bool { return a.Subject == b.Subject }) {
		t.Fatal("the batched stream's records are not in the per-record stream's order")
	}
}
