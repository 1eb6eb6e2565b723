package worker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// A provider that opens its stream at once and produces its first token
// only at the drawn first byte: the attempt's FirstByte is that token, and
// heartbeats cover the wait, for streaming and non-streaming callers alike
// (the worker streams from the provider either way).
func TestFirstByteIsTheFirstTokenOfAStreamOpenedEarly(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "streaming", false: "non-streaming"}[stream]
		t.Run(name, func(t *testing.T) {
			// The first token after 50 ms, heartbeats every 5 ms.
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 50, 20, 1000), OpenEarly: true}})
			att := h.attempt("hg_open_early_" + name)
			att.Request.Stream = stream
			if !stream {
				att.CommitPoint = schemas.Complete
			}
			in := h.send(att)
			in.accept()
			rs, res := in.untilResult()
			_, heartbeats, firstByte := checkStream(t, rs)
			if !firstByte || heartbeats == 0 {
				t.Fatalf("replies %v: want heartbeats while the stream is open without a token, then a first byte", kinds(rs))
			}
			// The token cannot come before the drawn first byte; the
			// stream's opening did, at once.
			if res.StatusClass != schemas.StatusOK || res.HTTPStatus != 200 || res.FirstByteMs == nil || *res.FirstByteMs < 50 {
				t.Errorf("result %s, http %d, first_byte_ms %v: want ok, 200 and the first byte at the token (≥ 50 ms)",
					res.StatusClass, res.HTTPStatus, res.FirstByteMs)
			}
			if rec := h.record(); rec.FirstByteMs == nil || *rec.FirstByteMs < 50 {
				t.Errorf("record first_byte_ms %v, want the first token's (≥ 50 ms)", rec.FirstByteMs)
			}
		})
	}
}

// A provider that opens its stream and then produces nothing keeps the
// attempt beating: the dispatcher's heartbeat timeout must not take a
// silent model for a lost worker, and only a first token ends the beats.
func TestHeartbeatsGoOnWhileAnOpenStreamHasNoToken(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: hangModel(t), OpenEarly: true}})
	att := h.attempt("hg_open_silent")
	in := h.send(att)
	acc := in.accept()
	// The stream opens at once; many heartbeat intervals later it has
	// still sent no token, and the heartbeats still come.
	const beats = 20
	var before []schemas.Reply
	for len(before) < beats {
		r := in.next()
		if _, ok := r.(*schemas.Heartbeat); !ok {
			t.Fatalf("got %s after %d heartbeats, want only heartbeats from a stream without a token", r.ReplyType(), len(before))
		}
		before = append(before, r)
	}
	h.cancel(acc, schemas.CancelLostRace)
	rs, res := in.untilResult()
	if _, _, firstByte := checkStream(t, append(before, rs...)); firstByte {
		t.Errorf("replies %v: a first byte without a token", kinds(rs))
	}
	if res.StatusClass != schemas.StatusCanceled || res.FirstByteMs != nil {
		t.Errorf("result %s, first_byte_ms %v: want canceled without a first byte", res.StatusClass, res.FirstByteMs)
	}
	if prov := h.prov.record(t); prov.Status != 200 || prov.TokensSent != 0 {
		t.Errorf("provider record %+v: want a stream opened with 200 that sent no token", prov)
	}
}

// stallAfterFirstToken is an upstream that sends one token, then produces
// nothing until release is closed (or its context ends): a model slow
// between tokens, or a worker whose heartbeats alone say it is alive.
type stallAfterFirstToken struct{ release chan struct{} }

func (s stallAfterFirstToken) Stream(ctx context.Context, _ *schemas.ChatRequest, sink upstream.Sink) (upstream.Outcome, error) {
	sink.FirstByte()
	sink.Delta(upstream.Delta{Content: "Hello", Tokens: 1})
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	sink.Delta(upstream.Delta{Content: " world", Tokens: 1})
	return upstream.Outcome{FinishReason: "stop", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 2}}, nil
}

// Heartbeats go on after the first token until the result, for streaming
// and non-streaming callers alike: a worker killed mid-answer must be
// noticed within the dispatcher's heartbeat timeout, not at the deadline
// (docs/architecture.md §4 rule 4, §8).
func TestHeartbeatsGoOnAfterTheFirstTokenUntilTheResult(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "streaming", false: "not streaming"}[stream], func(t *testing.T) {
			release := make(chan struct{})
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 0.01, 2, 1000)}, upstream: stallAfterFirstToken{release: release}})
			att := h.attempt("hg_beats_after_first")
			att.Request.Stream = stream
			in := h.send(att)
			in.accept()
			var before []schemas.Reply
			after := 0
			for after < 5 {
				r := in.next()
				before = append(before, r)
				if _, ok := r.(*schemas.Heartbeat); ok && slices.ContainsFunc(before, func(r schemas.Reply) bool { _, fb := r.(*schemas.FirstByte); return fb }) {
					after++
				}
			}
			close(release)
			rs, res := in.untilResult()
			if _, _, firstByte := checkStream(t, append(before, rs...)); !firstByte {
				t.Fatalf("replies %v: no first byte", kinds(append(before, rs...)))
			}
			if res.StatusClass != schemas.StatusOK {
				t.Errorf("result %s, want ok", res.StatusClass)
			}
			// Nothing comes on the inbox after the result: the heartbeats stopped with it.
			if n, _, _ := in.sub.Pending(); n != 0 {
				t.Errorf("%d messages after the result", n)
			}
		})
	}
}

// gapUpstream answers two tokens and reports gap as the stream's longest
// gap between tokens, as the adapter measures it.
type gapUpstream struct{ gap time.Duration }

func (g gapUpstream) Stream(_ context.Context, _ *schemas.ChatRequest, sink upstream.Sink) (upstream.Outcome, error) {
	sink.FirstByte()
	sink.Delta(upstream.Delta{Content: "Hello", Tokens: 1})
	sink.Delta(upstream.Delta{Content: " world", Tokens: 1})
	return upstream.Outcome{FinishReason: "stop", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 2}, MaxTokenGap: g.gap}, nil
}

// The result carries the stream's longest gap between tokens after the
// first in whole milliseconds rounded up — a measured gap is never 0 — and
// nothing when none was measured; the dispatcher derives its cohort's stall
// bound from it (docs/architecture.md §4 rule 4). Every reply is checked
// against its schema on the way.
func TestTheResultCarriesTheLongestGapBetweenTokensRoundedUpToAMillisecond(t *testing.T) {
	tests := []struct {
		name string
		gap  time.Duration
		want int64
	}{
		{"no gap measured: absent", 0, 0},
		{"a gap under a millisecond is 1 ms", 300 * time.Microsecond, 1},
		{"whole milliseconds stay", 180 * time.Millisecond, 180},
		{"a fraction rounds up", 1500 * time.Microsecond, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 0.01, 2, 1000)}, upstream: gapUpstream{gap: tc.gap}})
			in := h.send(h.attempt("hg_gap"))
			in.accept()
			_, res := in.untilResult()
			if res.StatusClass != schemas.StatusOK || res.MaxTokenGapMs != tc.want {
				t.Fatalf("result %s with max_token_gap_ms %d, want ok with %d", res.StatusClass, res.MaxTokenGapMs, tc.want)
			}
		})
	}
}

// A dispatcher that folds the first byte into the first chunk
// (schemas.Attempt.FoldsFirstByte) is sent no FirstByte for a stream: the
// chunk with the first token, which goes out at once, stands for it. A
// caller that wants the whole answer still gets its FirstByte as the token
// comes, since nothing else would tell the dispatcher before the result.
func TestAFoldedFirstByteIsTheFirstChunkOfAStreamOnly(t *testing.T) {
	for _, tc := range []struct {
		name          string
		stream        bool
		wantFirstByte bool
	}{
		{"a stream's first chunk stands for it", true, false},
		{"a whole answer is sent its first byte", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The first token after 50 ms, heartbeats every 5 ms.
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 50, 20, 1000), OpenEarly: true}})
			att := h.attempt("hg_fold_" + map[bool]string{true: "stream", false: "whole"}[tc.stream])
			att.FoldsFirstByte = true
			att.Request.Stream = tc.stream
			if !tc.stream {
				att.CommitPoint = schemas.Complete
			}
			in := h.send(att)
			in.accept()
			rs, res := in.untilResult()
			sawFirstByte, sawChunk := false, false
			for _, r := range rs {
				switch m := r.(type) {
				case *schemas.FirstByte:
					if sawChunk {
						t.Fatalf("replies %v: a first byte after a chunk", kinds(rs))
					}
					sawFirstByte = true
				case *schemas.Chunk:
					if !sawChunk && !m.First {
						t.Fatalf("replies %v: the first chunk is not marked first", kinds(rs))
					}
					sawChunk = true
				}
			}
			if sawFirstByte != tc.wantFirstByte || sawChunk != tc.stream {
				t.Errorf("replies %v: first byte %v, chunks %v; want %v, %v", kinds(rs), sawFirstByte, sawChunk, tc.wantFirstByte, tc.stream)
			}
			if res.StatusClass != schemas.StatusOK || res.FirstByteMs == nil || *res.FirstByteMs < 50 {
				t.Errorf("result %s, first_byte_ms %v: want ok and the first byte at the token (≥ 50 ms)", res.StatusClass, res.FirstByteMs)
			}
		})
	}
}
