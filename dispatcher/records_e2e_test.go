package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// watchedRecorder is a real records.Publisher that notes when the
// committed group's record was kept.
type watchedRecorder struct {
	*records.Publisher
	mu   sync.Mutex
	kept map[string]bool // stored subjects Commit returned for
}

func (w *watchedRecorder) Commit(subject string, data []byte) error {
	err := w.Publisher.Commit(subject, data)
	w.mu.Lock()
	w.kept[subject] = err == nil
	w.mu.Unlock()
	return err
}

func (w *watchedRecorder) wasKept(subject string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kept[subject]
}

// streamRecord is the one record the stream keeps on subject.
func streamRecord(t *testing.T, js jetstream.JetStream, subject string, into any) bool {
	t.Helper()
	data, found, err := records.Reader{JS: js, Stream: "records_test"}.Last(context.Background(), subject)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if !found {
		return false
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("record on %s: %v", subject, err)
	}
	return true
}

func TestAnsweredGroupsAreKeptBeforeTheAnswerAndEndWithOneRecordEach(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "non-streaming", true: "streaming"}[stream]
		t.Run(name, func(t *testing.T) {
			// The primary hangs: the hedge wins and the group ends only
			// once the primary observed its cancel, after the answer.
			c, _ := twoRoutes(t, newScript(behaviour{words: 5}, behaviour{hang: true}))
			nc := natstest.Connect(t, c.ns)
			pub, err := records.Open(context.Background(), nc, records.Options{Stream: "records_test", MaxAge: time.Hour,
				MaxBytes: 8 << 20, Replicas: 1, Duplicates: time.Minute, MaxPending: 256, CommitTimeout: 5 * time.Second}, nil, testLogger())
			if err != nil {
				t.Fatal(err)
			}
			rec := &watchedRecorder{Publisher: pub, kept: map[string]bool{}}
			gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Records: rec})
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}

			var sinkSawUnkept bool
			var group string
			sink := commitSinkFunc{delta: func(Delta) error { return nil }, committed: func(r *Response) {
				group = r.GroupID
				sinkSawUnkept = !rec.wasKept(schemas.StoredGroupSubject(r.GroupID))
			}}
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(stream)}, sink)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if stream && (group != resp.GroupID || sinkSawUnkept) {
				t.Fatalf("the stream's commit reached the caller before its record was kept (group %q)", group)
			}
			// The answer is back: the group's record is in the stream now,
			// whether the group has ended yet or not.
			var atCommit schemas.GroupRecord
			if !streamRecord(t, js, schemas.StoredGroupSubject(resp.GroupID), &atCommit) {
				t.Fatal("an answered group has no record in the stream")
			}
			if atCommit.Outcome != schemas.GroupCommitted || atCommit.WinnerAttempt != 2 || atCommit.HedgeGroupID != resp.GroupID {
				t.Fatalf("record at the answer: %+v", atCommit)
			}

			live := c.groupRecord(resp.GroupID) // the group ended
			c.attemptRecords(resp.GroupID, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := pub.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			var final schemas.GroupRecord
			if !streamRecord(t, js, schemas.StoredGroupSubject(resp.GroupID), &final) {
				t.Fatal("the group's record left the stream")
			}
			if final.Event != schemas.EventGroupComplete || final.LoserFinishedLate != live.LoserFinishedLate ||
				final.UsageInputUnits != live.UsageInputUnits || final.Attempts != 2 || !final.HedgeLaunched {
				t.Fatalf("the stream's group record %+v is not the group's final one %+v", final, live)
			}
			if final.DuplicateRateWindow != 1 {
				t.Fatalf("duplicate_rate_window = %v, want 1 (one hedge per primary)", final.DuplicateRateWindow)
			}
			for n, want := range map[int]schemas.Outcome{1: schemas.OutcomeLoserCanceled, 2: schemas.OutcomeWinner} {
				var a schemas.AttemptRecord
				if !streamRecord(t, js, schemas.StoredAttemptSubject(resp.GroupID, n), &a) {
					t.Fatalf("attempt %d has no record in the stream", n)
				}
				if a.Outcome != want || a.Reporter != schemas.ReporterDispatcher || a.DuplicateRateWindow <= 0 {
					t.Fatalf("attempt %d record %+v", n, a)
				}
			}
			// Read as every reader reads them: batches split, each
			// subject's latest record.
			kept, err := records.Reader{JS: js, Stream: "records_test"}.Kept(context.Background(), time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if len(kept) != 3 {
				t.Fatalf("the stream holds %d records, want 3: one group, two attempts", len(kept))
			}
		})
	}
}

// commitSinkFunc is a CommitSink of two funcs.
type commitSinkFunc struct {
	delta     func(Delta) error
	committed func(*Response)
}

func (s commitSinkFunc) Delta(d Delta) error   { return s.delta(d) }
func (s commitSinkFunc) Committed(r *Response) { s.committed(r) }

// A takeover that clears an orphaned commit's winner gate holding
// (Submission.Supersedes, docs/architecture.md §2) keeps a record saying so
// before it claims again — so before its own commit is kept or answered —
// on a subject of its own, which leaves the orphan's record in place: it
// names the orphan, its attempt and fenced epoch, and the takeover, whose
// group record names the orphan back. A takeover that meets another holder
// supersedes nothing and records nothing of the kind.
func TestATakeoverKeepsTheOrphansCommitMarkedSupersededBeforeItsOwnCommit(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 3}))
	nc := natstest.Connect(t, c.ns)
	pub, err := records.Open(context.Background(), nc, records.Options{Stream: "records_test", MaxAge: time.Hour,
		MaxBytes: 8 << 20, Replicas: 1, Duplicates: time.Minute, MaxPending: 256, CommitTimeout: 5 * time.Second}, nil, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	rec := &watchedRecorder{Publisher: pub, kept: map[string]bool{}}
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Records: rec})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, holder, supersedes string
		superseded               bool
	}{
		{"the orphan's commit is marked superseded by the takeover", "deaddeadbeef-1", "deaddeadbeef-1", true},
		{"another group's commit stands and nothing is marked", "deaddeadbeef-3", "deaddeadbeef-4", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprintf("takeover-%d", i)
			ua := schemas.UserActionID(d.secret, "", key)
			orphan, err := gate.Claim(t.Context(), ua, tt.holder, 2)
			if err != nil || !orphan.Won {
				t.Fatalf("the dead gateway's claim: %+v, %v", orphan, err)
			}
			orphanGate, err := arbiter.ParseGateValue(orphan.Value)
			if err != nil {
				t.Fatal(err)
			}
			var markedBeforeCommit bool
			sink := commitSinkFunc{delta: func(Delta) error { return nil }, committed: func(*Response) {
				markedBeforeCommit = rec.wasKept(schemas.StoredSupersededSubject(tt.holder))
			}}
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", IdempotencyKey: key, Request: chat(true),
				Supersedes: tt.supersedes}, sink)
			var marked schemas.SupersededRecord
			kept := streamRecord(t, js, schemas.StoredSupersededSubject(tt.holder), &marked)
			if !tt.superseded {
				var ge *GroupError
				if !errors.As(err, &ge) || ge.Code != schemas.ErrAlreadyCommitted {
					t.Fatalf("Submit = %+v, %v; want already_committed", resp, err)
				}
				if kept || streamRecord(t, js, schemas.StoredSupersededSubject(tt.supersedes), &marked) {
					t.Fatalf("a superseded record for a commit that stands: %+v", marked)
				}
				if g := c.groupRecord(ge.Group); g.Supersedes != "" {
					t.Fatalf("the group that superseded nothing names %q in supersedes", g.Supersedes)
				}
				return
			}
			if err != nil {
				t.Fatalf("Submit: %v; want the takeover to commit", err)
			}
			if !markedBeforeCommit {
				t.Fatal("the takeover's commit reached its caller before the orphan's superseded record was kept")
			}
			want := schemas.SupersededRecord{V: schemas.Version, Event: schemas.EventGroupSuperseded, EventTime: marked.EventTime,
				Reporter: schemas.ReporterDispatcher, UserActionID: ua, HedgeGroupID: tt.holder, WinnerAttempt: 2,
				GateEpoch: orphanGate.Epoch, SupersededBy: resp.GroupID}
			if !kept || marked != want {
				t.Fatalf("superseded record %+v (kept %v); want %+v", marked, kept, want)
			}
			if g := c.groupRecord(resp.GroupID); g.Supersedes != tt.holder || g.GateEpoch <= orphanGate.Epoch {
				t.Fatalf("the takeover's group record names %q at epoch %d; want %q after epoch %d",
					g.Supersedes, g.GateEpoch, tt.holder, orphanGate.Epoch)
			}
		})
	}
}
