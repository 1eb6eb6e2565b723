package natsdoor

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/replaytest"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

var committed = &dispatcher.Response{UserActionID: "ua-1", GroupID: "g-1", Content: "a0 a1 ", FinishReason: "stop",
	Attempts: 2, Hedged: true, Winner: 2, WinnerRoute: "b", Gate: "g-1/2/1"}

func replayOptions(t *testing.T) Options {
	t.Helper()
	store, err := replay.NewMemory(replay.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return Options{Replays: store}
}

func keyed(t *testing.T, key string, stream bool, temperature float64) []byte {
	t.Helper()
	req := chat(stream)
	if temperature != 0 {
		req.Temperature = &temperature
	}
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", IdempotencyKey: key, Request: req})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// exchange sends data on hedgerow.submit and returns every message of the
// answer, the final one last.
func exchange(t *testing.T, nc *nats.Conn, data []byte) []*nats.Msg {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: data}); err != nil {
		t.Error(err)
		return nil
	}
	var out []*nats.Msg
	for {
		m, err := sub.NextMsg(natsWait)
		if err != nil {
			t.Errorf("after %d messages: %v", len(out), err)
			return out
		}
		out = append(out, m)
		if m.Header.Get(schemas.HeaderStatus) != schemas.StatusChunk {
			return out
		}
	}
}

func sameMessages(a, b []*nats.Msg) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i].Data) != string(b[i].Data) || a[i].Header.Get(schemas.HeaderStatus) != b[i].Header.Get(schemas.HeaderStatus) {
			return false
		}
	}
	return true
}

func TestNATSRetryAfterCommitIsReplayedWithoutSubmitting(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "response", true: "stream"}[stream], func(t *testing.T) {
			d := startDoor(t, frontdoortest.Answer(committed, false, dispatcher.Delta{Content: "a0 "}, dispatcher.Delta{Content: "a1 "}), replayOptions(t))
			first := exchange(t, d.nc, keyed(t, "action-1", stream, 0))
			again := exchange(t, d.nc, keyed(t, "action-1", stream, 0))
			if !sameMessages(first, again) || first[len(first)-1].Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
				t.Fatalf("replay differs from the answer: %d then %d messages (first ends %s)", len(first), len(again), first[len(first)-1].Data)
			}
			for _, m := range again {
				if m.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
					t.Fatalf("replayed message without %s: %v", frontdoor.HeaderIdempotentReplayed, m.Header)
				}
			}
			if n := len(d.sub.Submissions()); n != 1 {
				t.Fatalf("%d submissions; the retry must replay", n)
			}
		})
	}
}

func TestNATSKeyReusedWithAnotherRequestIsRefused(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(committed, false), replayOptions(t))
	exchange(t, d.nc, keyed(t, "action-1", false, 0))
	m := request(t, d.nc, keyed(t, "action-1", false, 0.5), nil)
	errorAnswer(t, m, schemas.ErrInvalidRequest, http.StatusConflict)
	if m.Header.Get(schemas.HeaderShouldRetry) != "false" {
		t.Fatalf("%s = %q, want false", schemas.HeaderShouldRetry, m.Header.Get(schemas.HeaderShouldRetry))
	}
	if n := len(d.sub.Submissions()); n != 1 {
		t.Fatalf("%d submissions; a reused key must not submit", n)
	}
}

// An answer over ReplayMaxBytes leaves its tombstone: the retry is refused
// 409 answer_not_kept at once, with no submission (docs/architecture.md §2).
func TestNATSRetryOfAnAnswerTooLargeToKeepIsRefusedAnswerNotKept(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "response", true: "stream"}[stream], func(t *testing.T) {
			opts := replayOptions(t)
			opts.ReplayMaxBytes = 16 // every answer here is larger
			d := startDoor(t, frontdoortest.Answer(committed, false, dispatcher.Delta{Content: "a0 "}, dispatcher.Delta{Content: "a1 "}), opts)
			first := exchange(t, d.nc, keyed(t, "action-1", stream, 0))
			if len(first) == 0 || first[len(first)-1].Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
				t.Fatalf("the first request: %d messages; want its answer delivered", len(first))
			}
			m := request(t, d.nc, keyed(t, "action-1", stream, 0), nil)
			errorAnswer(t, m, schemas.ErrAnswerNotKept, http.StatusConflict)
			if m.Header.Get(schemas.HeaderShouldRetry) != "false" {
				t.Fatalf("%s = %q, want false", schemas.HeaderShouldRetry, m.Header.Get(schemas.HeaderShouldRetry))
			}
			if n := len(d.sub.Submissions()); n != 1 {
				t.Fatalf("%d submissions; the retry must not submit", n)
			}
		})
	}
}

func TestNATSTwinJoinsTheRequestInFlight(t *testing.T) {
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	d := startDoor(t, blockUntil(arrived, release, frontdoortest.Answer(committed, false)), replayOptions(t))
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the door's Stop, which waits for its calls
	var wg sync.WaitGroup
	answers := make([][]*nats.Msg, 2)
	wg.Go(func() { answers[0] = exchange(t, d.nc, keyed(t, "action-1", false, 0)) })
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the first request never submitted")
	}
	wg.Go(func() { answers[1] = exchange(t, d.nc, keyed(t, "action-1", false, 0)) })
	eventually.True(t, natsWait, "the twin joined", func() bool { return d.svc.flights.Joined(replay.Key("", "action-1")) == 1 })
	free()
	wg.Wait()
	if !sameMessages(answers[0], answers[1]) || len(d.sub.Submissions()) != 1 {
		t.Fatalf("twin answer differs or it submitted: %d submissions", len(d.sub.Submissions()))
	}
}

// A twin reaching another replica's door (its own NATS, the same store)
// while the first request runs waits on its in-flight lease and is sent
// the first one's messages, with no submission of its own.
func TestNATSTwinOnAnotherReplicaWaitsAndIsReplayed(t *testing.T) {
	store, err := replay.NewMemory(replay.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	first := startDoor(t, blockUntil(arrived, release, frontdoortest.Answer(committed, false)), Options{Replays: store, DispatcherID: "d-1"})
	other := startDoor(t, frontdoortest.Answer(committed, false), Options{Replays: store, DispatcherID: "d-2"})
	var wg sync.WaitGroup
	answers := make([][]*nats.Msg, 2)
	wg.Go(func() { answers[0] = exchange(t, first.nc, keyed(t, "action-1", false, 0)) })
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the first request never submitted")
	}
	wg.Go(func() { answers[1] = exchange(t, other.nc, keyed(t, "action-1", false, 0)) })
	eventually.True(t, natsWait, "the twin to wait on the first one's lease", func() bool {
		return other.svc.flights.Waiting(replay.Key("", "action-1")) >= 1
	})
	free()
	wg.Wait()
	if !sameMessages(answers[0], answers[1]) || answers[1][0].Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
		t.Fatal("the twin's answer is not the first one's, replayed")
	}
	if n := len(other.sub.Submissions()); n != 0 {
		t.Fatalf("the twin's replica submitted %d times; want none", n)
	}
}

// A request whose lease lapsed with no answer (its gateway died) is taken
// over: the retry submits, naming the orphaned request's group in Supersedes.
func TestNATSRetryOfAnOrphanedRequestSupersedesItsGroup(t *testing.T) {
	clock := replaytest.NewClock()
	store, err := replay.NewMemory(replay.MemoryOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	d := startDoor(t, frontdoortest.Answer(committed, false), Options{Replays: store, DispatcherID: "d-2", ReplayLease: time.Second})
	// The dead gateway's request: same fingerprint, its lease never refreshed.
	sub, f := d.svc.submission(keyed(t, "action-1", false, 0), "")
	if f != nil {
		t.Fatal(f.Message)
	}
	fp, err := requestFingerprint(sub)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := store.Claim(t.Context(), replay.Key("", "action-1"), replay.Marker{Fingerprint: fp, Owner: "d-dead", Token: "t"}, time.Second); err != nil || !c.Won {
		t.Fatalf("the dead gateway's claim: %+v, %v", c, err)
	}
	clock.Advance(time.Second)
	m := exchange(t, d.nc, keyed(t, "action-1", false, 0))
	if len(m) != 1 || m[0].Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("the retry's answer: %d messages", len(m))
	}
	subs := d.sub.Submissions()
	if len(subs) != 1 || subs[0].Supersedes != "d-dead" {
		t.Fatalf("submissions %+v; want one superseding d-dead", subs)
	}
}

// A caller that leaves a committed stream midway never got its answer: the
// door lapses the request's lease, leaving it orphaned, so the retry takes
// it over at once instead of meeting the commit.
func TestNATSStreamWhoseCallerLeftLeavesItsRequestOrphaned(t *testing.T) {
	store, err := replay.NewMemory(replay.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := startDoor(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := sink.Delta(dispatcher.Delta{Content: "word "}); err != nil {
				return nil, err
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}, Options{Replays: store, DispatcherID: "d-1"})
	caller, err := nats.Connect(d.url)
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close()
	inbox := caller.NewInbox()
	sub, err := caller.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: keyed(t, "action-1", true, 0)}); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(natsWait); err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusChunk {
		t.Fatalf("first message %v (%v), want a chunk", m, err)
	}
	caller.Close() // gone without a word, mid-stream
	var orphan *replay.Marker
	eventually.True(t, natsWait, "the request's lease to lapse", func() bool {
		c, err := store.Claim(context.Background(), replay.Key("", "action-1"), replay.Marker{Fingerprint: "probe", Token: "probe"}, time.Minute)
		orphan = c.Orphaned
		return err == nil && c.Won
	})
	if orphan == nil || orphan.Owner != "test-1" {
		t.Fatalf("the lapsed marker %+v; want the request of group test-1 left orphaned", orphan)
	}
}
