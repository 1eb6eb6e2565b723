package dispatcher

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// TestASlowCallerDoesNotHoldUpAnotherGroupsReplies: every group's replies
// come through one subscription, so a group whose caller stopped reading
// its stream (its loop blocked handing over deltas) must not delay another
// group's answer.
func TestASlowCallerDoesNotHoldUpAnotherGroupsReplies(t *testing.T) {
	const chunks = 200 // well past what the stuck group's loop can buffer
	c := newCluster(t, []string{"a", "b"}, nil, "")
	streamSent := make(chan struct{})
	// On a loaded machine the stream's hedge may start too: it streams the
	// same, and only the first stream sent closes streamSent.
	var sentOnce sync.Once
	startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		if !a.Request.Stream {
			fw.answer(a, "quick answer")
			return
		}
		fw.accept(a)
		fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
		for seq := int64(1); seq <= chunks; seq++ {
			fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: seq, Delta: "x", Tokens: 1,
				CumulativeTokens: seq, First: seq == 1})
		}
		fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusOK,
			ErrorScope: schemas.ScopeNone, FinishReason: "stop", LastSeq: chunks, Usage: schemas.Usage{InputUnits: 10, OutputUnits: chunks}})
		if err := fw.nc.Flush(); err != nil {
			t.Error(err)
		}
		sentOnce.Do(func() { close(streamSent) })
	})

	stuck, release := make(chan struct{}), make(chan struct{})
	slowDone := make(chan error, 1)
	go func() {
		first := true
		_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, sinkFunc(func(Delta) error {
			if first {
				first = false
				close(stuck)
				<-release
			}
			return nil
		}))
		slowDone <- err
	}()
	defer func() {
		close(release)
		select {
		case <-slowDone:
		case <-time.After(10 * time.Second):
			t.Error("the slow caller's group never ended")
		}
	}()
	for _, ch := range []chan struct{}{stuck, streamSent} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the stuck stream did not start")
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.d.Submit(ctx, Submission{Pool: "general", Request: chat(false)}, nil)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("another group's answer waited for the stuck caller")
	}
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if resp.Content != "quick answer" {
		t.Errorf("content %q, want the quick answer", resp.Content)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the stuck stream ended early: %v", err)
	default:
	}
}

// A worker that folds its first byte (schemas.Attempt.FoldsFirstByte) sends
// no FirstByte: the dispatcher takes a stream's first chunk for it, and a
// whole answer's first byte from its result's first_byte_ms, back-dated by
// the time the worker says passed after it — in the attempt's record as in
// the group's.
func TestAFoldedFirstByteIsTakenFromTheFirstChunkOrTheResult(t *testing.T) {
	const workerElapsed, workerFirstByte = 60 * time.Millisecond, 10 * time.Millisecond
	c := newCluster(t, []string{"a"}, nil, "")
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		if !a.FoldsFirstByte {
			t.Error("the attempt does not say its dispatcher folds first bytes")
		}
		fw.accept(a)
		res := schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
			FinishReason: "stop", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1},
			ElapsedMs: workerElapsed.Milliseconds(), FirstByteMs: schemas.Millis(workerFirstByte)}
		if a.Request.Stream {
			fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1, Delta: "hi", Tokens: 1, CumulativeTokens: 1, First: true})
			res.LastSeq = 1
		} else {
			res.Content = "hi"
			// The provider's time after its first byte, which the result
			// reports; the dispatcher must not take the result's
			// arrival for the first byte.
			time.Sleep(workerElapsed - workerFirstByte)
		}
		fw.send(a, res)
	})
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.d.Submit(ctx, Submission{Pool: "general", Request: chat(stream)}, sinkFunc(func(Delta) error { return nil }))
		cancel()
		if err != nil {
			t.Fatalf("stream %v: Submit: %v", stream, err)
		}
		att := c.attemptRecords(resp.GroupID, 1)[1]
		grp := c.groupRecord(resp.GroupID)
		if att.FirstByteMs == nil || grp.FirstByteMs == nil {
			t.Fatalf("stream %v: first_byte_ms %v in the attempt's record, %v in the group's: want both", stream, att.FirstByteMs, grp.FirstByteMs)
		}
		if !stream {
			// The result came at least workerElapsed − workerFirstByte
			// after the first byte (+1: elapsed_ms is truncated, the
			// first byte's milliseconds may be rounded up).
			if limit := att.ElapsedMs - (workerElapsed - workerFirstByte).Milliseconds() + 1; *att.FirstByteMs > limit {
				t.Errorf("whole answer: first_byte_ms %d of elapsed %d ms: want it back-dated to ≤ %d", *att.FirstByteMs, att.ElapsedMs, limit)
			}
		}
	}
}
